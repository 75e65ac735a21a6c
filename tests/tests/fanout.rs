//! Fan-out: each consumer group of a stream reads each entry once, whatever another group's
//! subscription does with it. `billing` consumes through the sidecar and retries, delays and
//! dead-letters entries, and an operator redrives its dead letters; `shipping`, a plain
//! `XREADGROUP` consumer (fred, no sidecar), must read exactly the entries published, and the
//! stream never grows. A retried or delayed entry comes
//! back to billing with its own id and its count one higher, a delayed one never before it is
//! due, even when the sidecar that delayed it died (a restart on the same consumer name, or
//! another consumer that reclaims it). What the previous version left behind (a retry copy in
//! the stream, a member of the old delay set) is delivered once after an upgrade.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use window_sidecar::proto::dead_letter_service_client::DeadLetterServiceClient;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::{self, Mode, OutcomeKind};
use window_sidecar::redis::keys::companion_key;
use window_sidecar_harness::*;

const STREAM: &str = "orders";
const BILLING: &str = "billing";
const SHIPPING: &str = "shipping";
/// The delay of the `retry_after`s of the fan-out runs.
const DELAY: Duration = Duration::from_millis(300);
/// How much later than due a delayed entry may come back: the sidecar's timer, the round trips
/// and a loaded machine's scheduling. Never earlier: that direction has no tolerance.
const LATE: Duration = Duration::from_secs(5);

/// Stream entries as a group reads them: (id, fields), sorted, so that two reads compare as
/// multisets.
type Entries = Vec<(String, BTreeMap<String, String>)>;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Entry `n`: its number and an ordering key (`k`, three keys round-robin).
fn entry_fields(n: usize) -> Vec<(&'static str, String)> {
    vec![("n", n.to_string()), ("k", format!("k{}", n % 3))]
}

/// Publishes entries `0..n` through the sidecar; returns them as a group should read them.
async fn publish_entries(addr: &str, key: &str, n: usize) -> Entries {
    let mut client = connect_client(addr).await;
    let ids = publish(&mut client, key, (0..n).map(entry_fields).collect()).await;
    let published = ids
        .into_iter()
        .enumerate()
        .map(|(n, id)| {
            let fields = entry_fields(n)
                .into_iter()
                .map(|(f, v)| (f.to_owned(), v))
                .collect();
            (id, fields)
        })
        .collect();
    sorted(published)
}

fn sorted(mut entries: Entries) -> Entries {
    entries.sort();
    entries
}

// ---------------------------------------------------------------------------------------------
// Shipping: the other group, a plain consumer.
// ---------------------------------------------------------------------------------------------

/// Group `shipping`'s consumer `fred`: XREADGROUP and XACK by hand, no sidecar.
struct Shipping {
    client: Client,
    key: String,
}

impl Shipping {
    /// Creates the group at the start of `key` (with MKSTREAM: before anything is published).
    async fn create(client: &Client, key: &str) -> Self {
        let _: () = client
            .xgroup_create(key, SHIPPING, "0", true)
            .await
            .unwrap();
        Self {
            client: client.clone(),
            key: key.to_owned(),
        }
    }

    /// Reads and acks every entry the group has not read yet, until a read comes back empty.
    async fn read_all(&self) -> Entries {
        let mut read = Vec::new();
        loop {
            let reply: Value = self
                .client
                .xreadgroup(SHIPPING, "fred", Some(100), None, false, &self.key, ">")
                .await
                .unwrap();
            let entries = xread_entries(reply);
            if entries.is_empty() {
                return sorted(read);
            }
            let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
            let _: i64 = self.client.xack(&self.key, SHIPPING, ids).await.unwrap();
            read.extend(entries);
        }
    }
}

/// The entries of an `XREADGROUP` reply (null when there is nothing new): `[[key, [[id,
/// [field, value, …]], …]], …]`.
fn xread_entries(reply: Value) -> Entries {
    let text = |v: &Value| v.as_string().expect("a string");
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
            let fields = array(fields);
            let fields = fields
                .chunks(2)
                .map(|pair| (text(&pair[0]), text(&pair[1])))
                .collect();
            entries.push((text(&id), fields));
        }
    }
    entries
}

// ---------------------------------------------------------------------------------------------
// Billing: the group the sidecar serves.
// ---------------------------------------------------------------------------------------------

/// What billing answers to one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Ack, with `HINCRBY <key>:applied <n> 1` as its side effect.
    Ack,
    Retry,
    RetryAfter(Duration),
}

/// One delivery billing got.
#[derive(Clone, Debug)]
struct Got {
    n: usize,
    id: String,
    count: u32,
    /// When it arrived, and the Unix time in ms then (due times in Redis are Unix ms).
    at: Instant,
    at_ms: u64,
}

/// How billing's subscription is opened: ordered by `k` or not, in which mode.
#[derive(Clone, Copy, Debug)]
struct Variant {
    ordered: bool,
    mode: Mode,
}

fn billing_open(key: &str, consumer: &str, count: u32, variant: Variant) -> proto::Open {
    let mut open = stream_open(key, BILLING, consumer, count);
    open.mode = variant.mode as i32;
    if variant.ordered {
        open.ordering_key = Some(proto::OrderingKey {
            source: Some(proto::ordering_key::Source::Field("k".into())),
        });
    }
    open
}

/// Billing's subscription and everything it saw and sent.
struct Billing {
    sub: Subscription,
    /// Where acks count their side effect: a hash of n -> times applied.
    applied: String,
    /// Every delivery, in order of arrival.
    got: Vec<Got>,
    /// When each `retry_after` was sent (and the Unix time in ms then), by (n, count of the
    /// delivery it answered).
    delayed_at: HashMap<(usize, u32), (Instant, u64)>,
    /// The numbers acked, in order.
    acked: Vec<usize>,
    /// Every flush report.
    reports: Vec<proto::FlushReport>,
}

impl Billing {
    async fn open(addr: &str, key: &str, open: proto::Open) -> Self {
        let mut client = connect_client(addr).await;
        let (sub, _) = Subscription::open(&mut client, open).await.unwrap();
        Self {
            sub,
            applied: format!("{key}:applied"),
            got: Vec::new(),
            delayed_at: HashMap::new(),
            acked: Vec::new(),
            reports: Vec::new(),
        }
    }

    /// Answers each delivery with `answer(n, delivery count)` until `done`; every flush report
    /// must be ok.
    async fn run(&mut self, answer: impl Fn(usize, u32) -> Answer, done: impl Fn(&Self) -> bool) {
        while !done(self) {
            match self.sub.next().await.unwrap() {
                Some(Kind::Read(read)) => self.answer(&read, &answer).await,
                Some(Kind::Flush(report)) => {
                    assert!(report.ok, "{report:?}");
                    self.reports.push(report);
                }
                other => panic!("billing got {other:?}"),
            }
        }
    }

    /// Half-closes the subscription and reads to the end of the stream, which comes once the
    /// sidecar flushed what was answered: a delivery that was on its way is seen (and left
    /// unanswered).
    async fn finish(&mut self) {
        self.sub.close();
        loop {
            match self.sub.next().await.unwrap() {
                None => return,
                Some(Kind::Read(read)) => {
                    self.record(&read);
                }
                Some(Kind::Flush(report)) => {
                    assert!(report.ok, "{report:?}");
                    self.reports.push(report);
                }
                Some(other) => panic!("billing got {other:?}"),
            }
        }
    }

    /// Records the deliveries of a read; returns their numbers.
    fn record(&mut self, read: &proto::Read) -> Vec<usize> {
        let (at, at_ms) = (Instant::now(), unix_ms());
        let mut numbers = Vec::new();
        for d in &read.deliveries {
            let n: usize = field(d, "n").parse().expect("n is a number");
            numbers.push(n);
            self.got.push(Got {
                n,
                id: d.entry_id.clone(),
                count: d.delivery_count,
                at,
                at_ms,
            });
        }
        numbers
    }

    async fn answer(&mut self, read: &proto::Read, answer: &impl Fn(usize, u32) -> Answer) {
        let (mut commands, mut outcomes, mut delayed) = (Vec::new(), Vec::new(), Vec::new());
        let numbers = self.record(read);
        for (d, n) in read.deliveries.iter().zip(numbers) {
            match answer(n, d.delivery_count) {
                Answer::Ack => {
                    let number = n.to_string();
                    commands.push(command(d.slot, "HINCRBY", &[&self.applied, &number, "1"]));
                    outcomes.push(outcome(d.slot, OutcomeKind::Ack));
                    self.acked.push(n);
                }
                Answer::Retry => outcomes.push(outcome(d.slot, OutcomeKind::Retry)),
                Answer::RetryAfter(delay) => {
                    outcomes.push(retry_after(d.slot, delay));
                    delayed.push((n, d.delivery_count));
                }
            }
        }
        // The flush that schedules them cannot start before this: their due time is later.
        let sent = (Instant::now(), unix_ms());
        self.delayed_at
            .extend(delayed.into_iter().map(|k| (k, sent)));
        self.sub.send(commands, outcomes).await;
    }

    /// Each number's deliveries as (id, count), in order.
    fn deliveries(&self) -> BTreeMap<usize, Vec<(String, u32)>> {
        let mut by_n: BTreeMap<usize, Vec<(String, u32)>> = BTreeMap::new();
        for got in &self.got {
            by_n.entry(got.n)
                .or_default()
                .push((got.id.clone(), got.count));
        }
        by_n
    }

    /// How many acks were sent.
    fn acks(&self) -> usize {
        self.acked.len()
    }

    fn dead_lettered(&self) -> u32 {
        self.reports.iter().map(|r| r.dead_lettered).sum()
    }

    /// The delay between the `retry_after` of `n`'s delivery `count` and the delivery after it.
    fn waited(&self, n: usize, count: u32) -> Duration {
        let (sent, _) = self.delayed_at[&(n, count)];
        let back = self
            .got
            .iter()
            .find(|g| g.n == n && g.count > count)
            .unwrap_or_else(|| panic!("entry {n} never came back after delivery {count}"));
        back.at.duration_since(sent)
    }
}

/// Waits until group `group` has nothing pending.
async fn until_settled(inspect: &Client, key: &str, group: &str) {
    assert!(
        eventually(STEP, || async { pending(inspect, key, group).await == 0 }).await,
        "{group} still has {} pending",
        pending(inspect, key, group).await
    );
}

/// The side effects billing's acks applied: n -> times.
async fn applied(inspect: &Client, key: &str) -> BTreeMap<usize, u32> {
    let hash: HashMap<String, u32> = inspect.hgetall(format!("{key}:applied")).await.unwrap();
    hash.into_iter()
        .map(|(n, times)| (n.parse().unwrap(), times))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1 and 4. Two groups, one stream: billing's retries and delays stay in billing.
// ---------------------------------------------------------------------------------------------

const ENTRIES: usize = 12;

/// Billing's plan: entry n ≡ 1 (mod 4) is retried on its first delivery, n ≡ 2 retried after
/// [`DELAY`]; everything else, and every later delivery, is acked.
fn plan(n: usize, count: u32) -> Answer {
    match (n % 4, count) {
        (1, 1) => Answer::Retry,
        (2, 1) => Answer::RetryAfter(DELAY),
        _ => Answer::Ack,
    }
}

/// Billing retries and delays some of [`ENTRIES`] entries through the sidecar, shipping reads
/// the stream by hand. Shipping reads exactly what was published (ids and fields, each once),
/// the stream holds exactly those entries; billing gets each retried or delayed entry back
/// with its own id and its count one higher (a delayed one not before [`DELAY`] after the
/// batch that delayed it was sent, and within [`LATE`] of that), applies each entry once and
/// leaves nothing pending.
async fn two_groups_one_stream(variant: Variant) {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    let shipping = Shipping::create(&inspect, STREAM).await;
    let published = publish_entries(&addr, STREAM, ENTRIES).await;
    let ids: Vec<String> = {
        let mut by_n: Vec<_> = published
            .iter()
            .map(|(id, f)| (f["n"].parse::<usize>().unwrap(), id.clone()))
            .collect();
        by_n.sort();
        by_n.into_iter().map(|(_, id)| id).collect()
    };

    let mut billing = Billing::open(&addr, STREAM, billing_open(STREAM, "c1", 4, variant)).await;
    billing.run(plan, |b| b.acks() == ENTRIES).await;
    billing.finish().await;
    until_settled(&inspect, STREAM, BILLING).await;

    // Shipping first: on a sidecar that copies retried entries, this is what shows it.
    assert_eq!(
        shipping.read_all().await,
        published,
        "shipping reads each published entry once, and nothing else"
    );
    let len: u64 = inspect.xlen(STREAM).await.unwrap();
    assert_eq!(len, ENTRIES as u64, "nothing was appended to the stream");
    assert_eq!(pending(&inspect, STREAM, SHIPPING).await, 0);

    let expected: BTreeMap<usize, Vec<(String, u32)>> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            let deliveries = match plan(n, 1) {
                Answer::Ack => vec![(id.clone(), 1)],
                _ => vec![(id.clone(), 1), (id.clone(), 2)],
            };
            (n, deliveries)
        })
        .collect();
    assert_eq!(
        billing.deliveries(),
        expected,
        "billing: each retried entry again, same id, count + 1"
    );
    for n in (0..ENTRIES).filter(|&n| plan(n, 1) == Answer::RetryAfter(DELAY)) {
        let waited = billing.waited(n, 1);
        assert!(
            waited >= DELAY && waited <= DELAY + LATE,
            "entry {n} came back {waited:?} after its retry_after of {DELAY:?} was sent"
        );
    }
    assert_eq!(
        applied(&inspect, STREAM).await,
        (0..ENTRIES).map(|n| (n, 1)).collect(),
        "each entry applied once"
    );
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_one_stream_unordered_pipeline() {
    two_groups_one_stream(Variant {
        ordered: false,
        mode: Mode::Pipeline,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_one_stream_unordered_atomic() {
    two_groups_one_stream(Variant {
        ordered: false,
        mode: Mode::Atomic,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_one_stream_ordered_pipeline() {
    two_groups_one_stream(Variant {
        ordered: true,
        mode: Mode::Pipeline,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_one_stream_ordered_atomic() {
    two_groups_one_stream(Variant {
        ordered: true,
        mode: Mode::Atomic,
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// 2. Dead letters.
// ---------------------------------------------------------------------------------------------

/// With `max_deliveries` 3, billing retries entry 0 and delays entry 1 (100 ms) on every
/// delivery and acks the rest: 0 and 1 are delivered three times each, same id, counts 1, 2, 3,
/// then go to the dead letter with their original id and 3 deliveries. Shipping read each
/// entry once; the stream holds what was published. Then both dead letters are redriven to
/// their origin (no `to`): each re-enters billing alone, as the entry it was (same id, its
/// count starting again at 1), and is acked; shipping reads nothing more, the stream gets no
/// entry and the dead letter is empty.
async fn retried_to_the_dead_letter_and_redriven(variant: Variant) {
    const N: usize = 4;
    let dead = "orders:dead";
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    // Billing's subscription takes a redriven entry at its next reclaim.
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "200ms"]).await;
    let addr = sidecar.addr.to_string();
    let shipping = Shipping::create(&inspect, STREAM).await;
    let published = publish_entries(&addr, STREAM, N).await;
    let id_of = |n: usize| {
        published
            .iter()
            .find(|(_, f)| f["n"] == n.to_string())
            .map(|(id, _)| id.clone())
            .unwrap()
    };

    let open = proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream(dead.into())),
        }),
        ..billing_open(STREAM, "c1", 4, variant)
    };
    let mut billing = Billing::open(&addr, STREAM, open).await;
    let answer = |n: usize, _| match n {
        0 => Answer::Retry,
        1 => Answer::RetryAfter(Duration::from_millis(100)),
        _ => Answer::Ack,
    };
    billing
        .run(answer, |b| b.acks() == N - 2 && b.dead_lettered() == 2)
        .await;
    until_settled(&inspect, STREAM, BILLING).await;

    assert_eq!(
        shipping.read_all().await,
        published,
        "shipping reads each entry once"
    );
    let len: u64 = inspect.xlen(STREAM).await.unwrap();
    assert_eq!(len, N as u64, "nothing was appended to the stream");
    let thrice = |n| (1..=3).map(|count| (id_of(n), count)).collect::<Vec<_>>();
    let expected = BTreeMap::from([
        (0, thrice(0)),
        (1, thrice(1)),
        (2, vec![(id_of(2), 1)]),
        (3, vec![(id_of(3), 1)]),
    ]);
    assert_eq!(billing.deliveries(), expected);
    let letters: Vec<(String, HashMap<String, String>)> =
        inspect.xrange(dead, "-", "+", None).await.unwrap();
    let mut letters: Vec<(String, String, String)> = letters
        .into_iter()
        .map(|(_, f)| {
            (
                f["n"].clone(),
                f["h:x-window-original-id"].clone(),
                f["h:x-window-deliveries"].clone(),
            )
        })
        .collect();
    letters.sort();
    assert_eq!(
        letters,
        [
            ("0".to_owned(), id_of(0), "3".to_owned()),
            ("1".to_owned(), id_of(1), "3".to_owned()),
        ]
    );
    assert_eq!(
        applied(&inspect, STREAM).await,
        BTreeMap::from([(2, 1), (3, 1)])
    );

    // The redrive: back into billing alone.
    let mut admin = DeadLetterServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let done = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: Some(proto::DeadLetterTarget {
                kind: Some(proto::dead_letter_target::Kind::Stream(dead.into())),
            }),
            selection: Some(proto::DeadLetterSelection {
                all: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut redriven: Vec<(String, String, String, String)> = done
        .redriven
        .iter()
        .map(|r| {
            let (to, group) = (r.to.clone(), r.group.clone());
            (r.new_id.clone(), to, group, r.skipped.clone())
        })
        .collect();
    redriven.sort();
    let back = |n| {
        (
            id_of(n),
            STREAM.to_owned(),
            BILLING.to_owned(),
            String::new(),
        )
    };
    assert_eq!(redriven, [back(0), back(1)], "{done:?}");
    billing.run(|_, _| Answer::Ack, |b| b.acks() == N).await;
    billing.finish().await;
    until_settled(&inspect, STREAM, BILLING).await;

    assert_eq!(shipping.read_all().await, [], "shipping reads nothing more");
    let len: u64 = inspect.xlen(STREAM).await.unwrap();
    assert_eq!(len, N as u64, "nothing was appended to the stream");
    let len: u64 = inspect.xlen(dead).await.unwrap();
    assert_eq!(len, 0, "the dead letters left the dead letter");
    let again = |n| [thrice(n), vec![(id_of(n), 1)]].concat();
    let expected = BTreeMap::from([
        (0, again(0)),
        (1, again(1)),
        (2, vec![(id_of(2), 1)]),
        (3, vec![(id_of(3), 1)]),
    ]);
    assert_eq!(billing.deliveries(), expected, "each redriven entry once");
    assert_eq!(
        applied(&inspect, STREAM).await,
        (0..N).map(|n| (n, 1)).collect()
    );
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_to_the_dead_letter_and_redriven_unordered_pipeline() {
    retried_to_the_dead_letter_and_redriven(Variant {
        ordered: false,
        mode: Mode::Pipeline,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_to_the_dead_letter_and_redriven_ordered_atomic() {
    retried_to_the_dead_letter_and_redriven(Variant {
        ordered: true,
        mode: Mode::Atomic,
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// 3. A delayed entry outlives the sidecar that delayed it.
// ---------------------------------------------------------------------------------------------

/// Billing delays entry 1 of three by 3 s (and acks 0 and 2) through the sidecar binary, which
/// is then SIGKILLed. The due time is in Redis: `{orders}:window:delayed:billing` scores the
/// entry id with it. A sidecar started again on the same address, at once or (`late`) only
/// once the entry is due, opens billing as `reopen_as` (with `min_idle` 500 ms, so that
/// another consumer reclaims the entry of the dead one): the entry comes back once, with its
/// own id, not before it is due (by the score Redis holds, and 3 s after the delaying batch
/// was sent), counted as its second delivery, as it would be had the sidecar lived: a
/// re-read or reclaim that found it not yet due held it, it did not deliver it, and the
/// `retry_after` itself counted nothing ahead. Shipping read each entry once.
async fn a_delayed_entry_outlives_its_sidecar(reopen_as: &str, late: bool) {
    const DUE_IN: Duration = Duration::from_secs(3);
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let flags = ["--reclaim-interval", "200ms", "--promote-interval", "100ms"];
    let first = SidecarProcess::serve(&redis.url(), &listen, &flags);
    let shipping = Shipping::create(&inspect, STREAM).await;
    let published = publish_entries(&listen, STREAM, 3).await;
    let delayed_id = published
        .iter()
        .find(|(_, f)| f["n"] == "1")
        .map(|(id, _)| id.clone())
        .unwrap();

    let unordered = Variant {
        ordered: false,
        mode: Mode::Pipeline,
    };
    let mut billing =
        Billing::open(&listen, STREAM, billing_open(STREAM, "c1", 3, unordered)).await;
    let answer = |n: usize, _| match n {
        1 => Answer::RetryAfter(DUE_IN),
        _ => Answer::Ack,
    };
    billing.run(answer, |b| b.got.len() == 3).await;
    let (sent, sent_ms) = billing.delayed_at[&(1, 1)];
    let delay_set = companion_key(STREAM, "window:delayed:billing");
    let due_ms = {
        let (inspect, delay_set, id) = (&inspect, &delay_set, &delayed_id);
        let scheduled = || async move {
            let due: Option<f64> = inspect.zscore(delay_set, id).await.unwrap();
            pending(inspect, STREAM, BILLING).await == 1 && due.is_some()
        };
        assert!(
            eventually(STEP, scheduled).await,
            "entry {id} was not left pending with its due time in {delay_set}"
        );
        let due: f64 = inspect.zscore(delay_set, id).await.unwrap();
        due as u64
    };
    assert!(
        due_ms >= sent_ms + DUE_IN.as_millis() as u64
            && due_ms <= unix_ms() + DUE_IN.as_millis() as u64,
        "due at {due_ms}: not 3 s after the retry_after ({sent_ms})"
    );
    first.kill9();
    drop(billing);
    let reopened_after = if late {
        let past_due = Duration::from_millis((due_ms + 500).saturating_sub(unix_ms()));
        tokio::time::sleep(past_due).await;
        sent.elapsed()
    } else {
        Duration::ZERO
    };

    let second = SidecarProcess::serve(&redis.url(), &listen, &flags);
    let open = billing_open(STREAM, reopen_as, 3, unordered)
        .with_min_idle(Some(Duration::from_millis(500)));
    let mut billing = Billing::open(&listen, STREAM, open).await;
    billing.run(|_, _| Answer::Ack, |b| !b.got.is_empty()).await;
    billing.finish().await;
    until_settled(&inspect, STREAM, BILLING).await;
    let got: Vec<(usize, String)> = billing.got.iter().map(|g| (g.n, g.id.clone())).collect();
    assert_eq!(
        got,
        [(1, delayed_id.clone())],
        "the delayed entry alone, once"
    );
    let back = &billing.got[0];
    assert!(
        back.at_ms >= due_ms,
        "delivered at {}, {} ms before it was due ({due_ms})",
        back.at_ms,
        due_ms - back.at_ms
    );
    let waited = back.at.duration_since(sent);
    assert!(
        waited >= DUE_IN && waited <= DUE_IN.max(reopened_after) + LATE,
        "came back {waited:?} after its retry_after of {DUE_IN:?} was sent"
    );
    assert_eq!(shipping.read_all().await, published);
    let len: u64 = inspect.xlen(STREAM).await.unwrap();
    assert_eq!(len, 3, "nothing was appended to the stream");
    assert_eq!(
        applied(&inspect, STREAM).await,
        BTreeMap::from([(0, 1), (1, 1), (2, 1)])
    );
    let back = &billing.got[0];
    assert_eq!(
        back.count, 2,
        "its second delivery: a re-read or reclaim that found it not yet due is none, and \
         its retry_after counted none ahead"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_entry_outlives_its_sidecar_on_the_same_consumer() {
    a_delayed_entry_outlives_its_sidecar("c1", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_entry_outlives_its_sidecar_reclaimed_by_another_consumer() {
    a_delayed_entry_outlives_its_sidecar("c2", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_entry_outlives_its_sidecar_reopened_past_its_due_time() {
    a_delayed_entry_outlives_its_sidecar("c1", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_entry_outlives_its_sidecar_reclaimed_past_its_due_time() {
    a_delayed_entry_outlives_its_sidecar("c2", true).await;
}

// ---------------------------------------------------------------------------------------------
// 5. What the previous version left behind.
// ---------------------------------------------------------------------------------------------

/// The previous version's retry fields on a copy of the first delivery of `original` (the
/// entry's own fields then `retry_fields`' headers: attempts, ruststream-fred's count, the
/// original id).
fn old_retry_fields(original: &str) -> Vec<(&'static str, String)> {
    vec![
        ("n", "0".to_owned()),
        ("h:x-window-attempts", "1".to_owned()),
        ("h:x-ruststream-retry-count", "1".to_owned()),
        ("h:x-window-original-id", original.to_owned()),
    ]
}

/// A member of the previous version's delay set `{key}:window:delayed`: the token (the entry
/// id), a newline, then each part as `<length>:<bytes>`. Written here byte for byte, as the
/// version that wrote them did, not with the server's encoder.
fn old_delay_member(token: &str, fields: &[(&str, String)]) -> String {
    let mut member = format!("{token}\n");
    for part in fields.iter().flat_map(|(f, v)| [*f, v.as_str()]) {
        member.push_str(&format!("{}:{part}", part.len()));
    }
    member
}

/// Entry `n=0`, first delivered to billing's consumer `old` of the previous version, which
/// settled it as its retry did: the first delivery acked and (by `requeue`) a copy written.
async fn delivered_once_by_the_old_version(
    inspect: &Client,
    requeue: impl AsyncFnOnce(&str),
) -> String {
    let original: String = inspect
        .xadd(STREAM, false, None, "*", vec![("n", "0")])
        .await
        .unwrap();
    let _: () = inspect
        .xgroup_create(STREAM, BILLING, "0", false)
        .await
        .unwrap();
    let _: Value = inspect
        .xreadgroup(BILLING, "old", Some(1), None, false, STREAM, ">")
        .await
        .unwrap();
    requeue(&original).await;
    let _: i64 = inspect.xack(STREAM, BILLING, &original).await.unwrap();
    original
}

/// Billing's next read through the sidecar (the upgraded version) is the copy alone, its
/// second delivery; acked, nothing is left for the group: nothing pending, nothing unread.
async fn the_copy_is_delivered_once(inspect: &Client, addr: &str, original: &str) -> String {
    let unordered = Variant {
        ordered: false,
        mode: Mode::Pipeline,
    };
    let mut billing = Billing::open(addr, STREAM, billing_open(STREAM, "c1", 4, unordered)).await;
    billing.run(|_, _| Answer::Ack, |b| !b.got.is_empty()).await;
    billing.finish().await;
    until_settled(inspect, STREAM, BILLING).await;
    let copy = billing.got[0].clone();
    assert_eq!(
        (billing.got.len(), copy.n, copy.count),
        (1, 0, 2),
        "the copy alone, as its second delivery: {:?}",
        billing.got
    );
    assert_ne!(copy.id, original);
    let unread: Value = inspect
        .xreadgroup(BILLING, "probe", Some(10), None, false, STREAM, ">")
        .await
        .unwrap();
    assert!(unread.is_null(), "billing has unread entries: {unread:?}");
    let len: u64 = inspect.xlen(STREAM).await.unwrap();
    assert_eq!(len, 2, "the original and its one copy");
    assert_eq!(applied(inspect, STREAM).await, BTreeMap::from([(0, 1)]));
    copy.id
}

/// A retry copy the previous version appended to the stream is delivered to billing once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_copy_of_the_previous_version_is_delivered_once() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let mut copy_id = String::new();
    let original = delivered_once_by_the_old_version(&inspect, async |original: &str| {
        copy_id = inspect
            .xadd(STREAM, false, None, "*", old_retry_fields(original))
            .await
            .unwrap();
    })
    .await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let delivered =
        the_copy_is_delivered_once(&inspect, &sidecar.addr.to_string(), &original).await;
    assert_eq!(delivered, copy_id);
    sidecar.stop().await;
}

/// A member of the previous version's delay set, due a second ago, is promoted (a copy
/// appended, as that version did) and delivered to billing once; the set is then empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_member_of_the_old_delay_set_is_delivered_once() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let old_set = companion_key(STREAM, "window:delayed");
    let original = delivered_once_by_the_old_version(&inspect, async |original: &str| {
        let member = old_delay_member(original, &old_retry_fields(original));
        let added: i64 = inspect
            .zadd(
                &old_set,
                None,
                None,
                false,
                false,
                ((unix_ms() - 1_000) as f64, member),
            )
            .await
            .unwrap();
        assert_eq!(added, 1);
    })
    .await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    the_copy_is_delivered_once(&inspect, &sidecar.addr.to_string(), &original).await;
    let left: u64 = inspect.zcard(&old_set).await.unwrap();
    assert_eq!(left, 0, "the old delay set is empty");
    sidecar.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Retention.
// ---------------------------------------------------------------------------------------------

/// Under retention by acknowledgement, retries add nothing for the other group to wait on:
/// shipping reads and acks every entry first, billing retries and delays some of them (each
/// held in the stream while it is pending in billing), and once billing has acked them all
/// the stream is down to what the trim always keeps (its newest entry, or nothing where the
/// server has XACKDEL): no retry left an entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_retention_retries_leave_nothing_behind_once_both_groups_acked() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let retention = ["--ack-retention", STREAM, "--retention-interval", "100ms"];
    let sidecar = Sidecar::start(&redis.url(), &retention).await;
    let addr = sidecar.addr.to_string();
    let shipping = Shipping::create(&inspect, STREAM).await;
    // Billing's group exists before anything is acked: retention keeps what it has not read.
    let _: () = inspect
        .xgroup_create(STREAM, BILLING, "0", false)
        .await
        .unwrap();
    let published = publish_entries(&addr, STREAM, ENTRIES).await;
    assert_eq!(shipping.read_all().await, published);

    let variant = Variant {
        ordered: false,
        mode: Mode::Pipeline,
    };
    let mut billing = Billing::open(&addr, STREAM, billing_open(STREAM, "c1", 4, variant)).await;
    billing.run(plan, |b| b.acks() == ENTRIES).await;
    billing.finish().await;
    until_settled(&inspect, STREAM, BILLING).await;
    assert_eq!(
        applied(&inspect, STREAM).await,
        (0..ENTRIES).map(|n| (n, 1)).collect(),
        "each entry applied once"
    );
    // The trim keeps the newest entry (the last one read, its floor); a server with XACKDEL
    // deletes that one too with the last ack.
    let newest = published.iter().map(|(id, _)| id.clone()).max_by_key(|id| {
        let (ms, seq) = id.split_once('-').unwrap();
        (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap())
    });
    let left = || async {
        let rows: Vec<(String, HashMap<String, String>)> =
            inspect.xrange(STREAM, "-", "+", None).await.unwrap();
        rows.into_iter().map(|(id, _)| id).collect::<Vec<_>>()
    };
    let emptied = eventually(STEP, || async {
        let left = left().await;
        left.is_empty() || (left.len() == 1 && Some(&left[0]) == newest.as_ref())
    });
    assert!(emptied.await, "the stream still holds {:?}", left().await);
    assert!(
        shipping.read_all().await.is_empty(),
        "nothing new for shipping"
    );
    sidecar.stop().await;
}
