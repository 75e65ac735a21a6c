//! The subscription engine under conditions the form tests do not reach: a consumer whose
//! window stays full past its reliable list's `dead_after`, delivery counts of claimed stream
//! entries and of abandoned simple-list entries (and the dead letters they lead to), list
//! subscriptions on keys of the wrong type, the last blocking read of a closing subscription,
//! the pace of dead-consumer recovery, a consumer group deleted under a running subscription,
//! and one consumer name opened on two sidecars.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use tokio::time::Instant;
use tonic::{Code, Status};
use window_sidecar::proto::OutcomeKind::Ack;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::{self, subscribe_request};
use window_sidecar_harness::*;

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).expect("a valid duration")
}

fn reliable(key: &str, consumer: &str, count: u32, dead_after: Duration) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: key.into(),
                consumer: consumer.into(),
                dead_after: Some(duration(dead_after)),
            },
        )),
        count,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    }
}

fn simple(key: &str, count: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: key.into(),
        })),
        count,
        max_in_flight: count,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    }
}

fn payload(d: &proto::Delivery) -> String {
    String::from_utf8_lossy(&d.payload).into_owned()
}

/// The next message if one comes within `wait` (shorter than the kit's own step, so the kit
/// never panics first).
async fn next_within(
    sub: &mut Subscription,
    wait: Duration,
) -> Option<Result<Option<Kind>, Status>> {
    tokio::time::timeout(wait, sub.next()).await.ok()
}

/// A message in a few words, for assertion messages.
fn describe(kind: &Kind) -> String {
    match kind {
        Kind::Opened(opened) => format!("opened as {:?}", opened.consumer),
        Kind::Read(read) => {
            let deliveries: Vec<_> = read
                .deliveries
                .iter()
                .map(|d| (d.entry_id.clone(), payload(d), d.delivery_count))
                .collect();
            format!("read {} {deliveries:?}", read.read_id)
        }
        Kind::Flush(report) => format!("flush report {report:?}"),
        Kind::Rejections(r) => format!("rejections {:?}", r.rejections),
        Kind::Draining(_) => "draining".into(),
    }
}

/// Waits up to `within` for the stream to end with a status. Otherwise, what came instead.
async fn status_within(sub: &mut Subscription, within: Duration) -> Result<Status, Vec<String>> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_within(sub, left).await {
            Some(Err(status)) => return Ok(status),
            Some(Ok(Some(kind))) => seen.push(describe(&kind)),
            Some(Ok(None)) => {
                seen.push("the end of the stream without a status".into());
                return Err(seen);
            }
            None => return Err(seen),
        }
    }
}

/// Half-closes the client's stream and waits (bounded) until the sidecar ends it.
async fn close_and_wait(sub: &mut Subscription) {
    sub.close();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_within(sub, left).await {
            Some(Ok(Some(_))) => {}
            Some(Ok(None)) => return,
            Some(Err(status)) => panic!("the closed stream ended with {status:?}"),
            None => panic!("the sidecar did not end the closed stream within 5 s"),
        }
    }
}

/// Opens a subscription, waiting at most `within` for its first answer: `Ok` when it opened,
/// the status when it was refused.
async fn try_open(
    client: &mut proto::window_service_client::WindowServiceClient<tonic::transport::Channel>,
    open: proto::Open,
    within: Duration,
) -> Result<(Subscription, proto::Opened), Status> {
    let mut sub = Subscription::start(client, subscribe_request::Kind::Open(open)).await?;
    match next_within(&mut sub, within).await {
        Some(Ok(Some(Kind::Opened(opened)))) => Ok((sub, opened)),
        Some(Err(status)) => Err(status),
        Some(Ok(other)) => panic!("expected opened or a status, got {other:?}"),
        None => panic!("no answer to open within {within:?}"),
    }
}

async fn raw(client: &Client, name: &'static str, args: Vec<&str>) -> Value {
    client
        .custom(
            fred::types::CustomCommand::new_static(name, fred::types::ClusterHash::FirstKey, false),
            args,
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

async fn len(client: &Client, key: &str) -> i64 {
    client.llen(key).await.unwrap()
}

async fn companion_keys(client: &Client, key: &str) -> Vec<String> {
    let pattern = format!("{{{key}}}:window:*");
    client
        .custom(fred::cmd!("KEYS"), vec![pattern])
        .await
        .expect("KEYS")
}

/// A consumer that holds a full window longer than `dead_after` is still alive: it reads
/// nothing because it may not, not because it died. Its heartbeat must outlive that, or
/// another consumer recovers its entries and they are handled twice.
#[tokio::test]
async fn a_live_reliable_list_consumer_keeps_its_entries_while_its_window_is_full() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "300ms"]).await;
    let dead_after = Duration::from_millis(1500);
    let open = |consumer: &str| proto::Open {
        max_in_flight: 2,
        ..reliable("jobs", consumer, 2, dead_after)
    };
    let mut client = sidecar.client().await;
    let (mut a, _) = Subscription::open(&mut client, open("a")).await.unwrap();
    for value in ["v1", "v2"] {
        let _: i64 = inspect.lpush("jobs", value).await.unwrap();
    }
    let mut held = Vec::new();
    while held.len() < 2 {
        held.extend(a.read().await.deliveries);
    }
    // B opens only now, so that A is the one that took both values.
    let (mut b, _) = Subscription::open(&mut client, open("b")).await.unwrap();
    let mut taken_by_b = Vec::new();
    let hold_until = Instant::now() + Duration::from_secs(5);
    loop {
        let left = hold_until.saturating_duration_since(Instant::now());
        match next_within(&mut b, left).await {
            None => break,
            Some(Ok(Some(Kind::Read(read)))) => {
                taken_by_b.extend(read.deliveries.iter().map(payload));
                let commands = read
                    .deliveries
                    .iter()
                    .map(|d| command(d.slot, "INCR", &["counter"]))
                    .collect();
                let acks = read.deliveries.iter().map(|d| outcome(d.slot, Ack));
                b.send(commands, acks.collect()).await;
            }
            Some(Ok(Some(_))) => {}
            Some(other) => panic!("B's stream ended: {other:?}"),
        }
    }
    assert!(
        taken_by_b.is_empty(),
        "B received {taken_by_b:?}, held unsettled by A whose stream stayed open, within 5 s"
    );

    a.send(
        held.iter()
            .map(|d| command(d.slot, "INCR", &["counter"]))
            .collect(),
        held.iter().map(|d| outcome(d.slot, Ack)).collect(),
    )
    .await;
    let mut settled = 0;
    while settled < 2 {
        let report = a.flush().await;
        assert!(report.ok, "A's flush: {report:?}");
        settled += report.segments_kept + report.segments_dropped;
    }
    let counter: i64 = inspect.get("counter").await.unwrap();
    assert_eq!(counter, 2, "each value's side effect ran once");
    drop((a, b));
    sidecar.stop().await;
}

/// Stream `s` with entries 1-0 to 5-0 pending in group `g` on interleaved owners: c (the
/// sidecar's consumer) has 2-0 and 4-0, x (dead) the others; 3-0 has been delivered six times.
/// Returns once x's entries are idle past `min_idle`.
async fn interleaved_pending(inspect: &Client, min_idle: Duration) {
    raw(inspect, "XGROUP", vec!["CREATE", "s", "g", "0", "MKSTREAM"]).await;
    for n in 1..=5 {
        let id = format!("{n}-0");
        let value = n.to_string();
        raw(inspect, "XADD", vec!["s", &id, "n", &value]).await;
    }
    for consumer in ["x", "c", "x", "c", "x"] {
        raw(
            inspect,
            "XREADGROUP",
            vec!["GROUP", "g", consumer, "COUNT", "1", "STREAMS", "s", ">"],
        )
        .await;
    }
    // XCLAIM without JUSTID counts a delivery.
    for _ in 0..5 {
        raw(inspect, "XCLAIM", vec!["s", "g", "x", "0", "3-0"]).await;
    }
    // x's entries must be idle past min_idle when the reclaim runs, while c's own (read again
    // when the subscription opens, which makes them fresh) are not: so c's 2-0 lies between
    // the claimed 1-0 and 3-0 in its pending list without being claimed itself.
    tokio::time::sleep(min_idle + Duration::from_millis(300)).await;
}

/// The fields of the dead letter of 3-0, if it is in the dead-letter stream.
async fn dead_letter_of_3_0(inspect: &Client) -> Option<HashMap<String, String>> {
    let dead: Vec<(String, HashMap<String, String>)> =
        inspect.xrange("dead", "-", "+", None).await.unwrap();
    dead.into_iter()
        .map(|(_, fields)| fields)
        .find(|f| f.get("h:x-window-original-id").map(String::as_str) == Some("3-0"))
}

/// Acks every delivery the reclaim brings (2-0 and 4-0 stay outstanding throughout) until 1-0
/// and 5-0 came and 3-0 is in the dead letter, for 6 s at most: the counts 1-0 and 5-0 came
/// with, and 3-0's if it was delivered.
async fn ack_the_claimed(
    sub: &mut Subscription,
    inspect: &Client,
) -> (HashMap<String, u32>, Option<u32>) {
    let mut claimed_counts: HashMap<String, u32> = HashMap::new();
    let mut third_delivered = None;
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        if claimed_counts.len() == 2 && dead_letter_of_3_0(inspect).await.is_some() {
            break;
        }
        match next_within(sub, Duration::from_millis(200)).await {
            Some(Ok(Some(Kind::Read(read)))) => {
                let mut acks = Vec::new();
                for d in &read.deliveries {
                    match d.entry_id.as_str() {
                        "3-0" => third_delivered = Some(d.delivery_count),
                        id @ ("1-0" | "5-0") => {
                            claimed_counts.insert(id.to_owned(), d.delivery_count);
                        }
                        _ => {}
                    }
                    acks.push(outcome(d.slot, Ack));
                }
                sub.send(vec![], acks).await;
            }
            Some(Ok(Some(_))) | None => {}
            Some(other) => panic!("the stream ended: {other:?}"),
        }
    }
    (claimed_counts, third_delivered)
}

/// A claimed stream entry's delivery count is the group's own counter, whatever else the
/// claiming consumer has pending: past the cap it goes to the dead letter unread.
#[tokio::test]
async fn a_claimed_stream_entry_keeps_the_groups_delivery_count_and_reaches_the_dead_letter() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let min_idle = Duration::from_secs(1);
    interleaved_pending(&inspect, min_idle).await;

    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "300ms"]).await;
    let mut client = sidecar.client().await;
    let mut open = proto::Open {
        max_in_flight: 4,
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("dead".into())),
        }),
        ..stream_open("s", "g", "c", 2)
    };
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.min_idle = Some(duration(min_idle));
    }
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let own: Vec<String> = sub
        .read()
        .await
        .deliveries
        .iter()
        .map(|d| d.entry_id.clone())
        .collect();
    assert_eq!(own, ["2-0", "4-0"], "its own pending entries come first");
    let (claimed_counts, third_delivered) = ack_the_claimed(&mut sub, &inspect).await;
    assert_eq!(
        third_delivered, None,
        "3-0 (delivered 6 times before, cap 3) was delivered to the client with this delivery_count"
    );
    let dead = dead_letter_of_3_0(&inspect)
        .await
        .expect("3-0 is in the dead-letter stream");
    let deliveries: u32 = dead["h:x-window-deliveries"].parse().unwrap();
    assert!(deliveries >= 6, "dead letter of 3-0: {dead:?}");
    for (id, count) in &claimed_counts {
        assert!(*count >= 2, "{id} was claimed with delivery_count {count}");
    }
    drop(sub);
    sidecar.stop().await;
}

/// A simple-list entry pushed back because its client left without an outcome was delivered:
/// the next delivery counts it, so an entry that keeps taking its client down reaches the
/// dead letter instead of circulating for ever.
#[tokio::test]
async fn an_abandoned_simple_list_entry_is_counted_and_reaches_the_dead_letter() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let _: i64 = inspect.lpush("tasks", "poison").await.unwrap();
    let open = || proto::Open {
        max_deliveries: 2,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::List("dead".into())),
        }),
        ..simple("tasks", 1)
    };
    let mut counts = Vec::new();
    for _ in 0..2 {
        let (mut sub, _) = Subscription::open(&mut client, open()).await.unwrap();
        let d = sub.read().await.deliveries.remove(0);
        assert_eq!(payload(&d), "poison");
        counts.push(d.delivery_count);
        close_and_wait(&mut sub).await;
        let back = eventually(Duration::from_secs(3), || async {
            len(&inspect, "tasks").await == 1
        })
        .await;
        assert!(back, "the abandoned entry was pushed back to the list");
    }
    // The third time it is past the cap: it must not reach the client.
    let (mut sub, _) = Subscription::open(&mut client, open()).await.unwrap();
    let deadline = Instant::now() + Duration::from_millis(1500);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_within(&mut sub, left).await {
            None => break,
            Some(Ok(Some(Kind::Read(read)))) => {
                counts.extend(read.deliveries.iter().map(|d| d.delivery_count));
            }
            Some(Ok(Some(_))) => {}
            Some(other) => panic!("the stream ended: {other:?}"),
        }
    }
    assert_eq!(
        counts,
        [1, 2],
        "delivery counts of the abandoned entry, the third open included"
    );
    // The dead letter is a frame of the value that says how often it was delivered: the two
    // deliveries the client saw.
    let dead: Vec<bytes::Bytes> = inspect.lrange("dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 1);
    let letter = window_sidecar::domain::frame::decode(&dead[0]).expect("a frame");
    let text = |s: &str| bytes::Bytes::copy_from_slice(s.as_bytes());
    assert_eq!(letter[0], (text("_payload"), text("poison")));
    assert!(
        letter.contains(&(text("h:x-window-deliveries"), text("2"))),
        "{letter:?}"
    );
    drop(sub);
    sidecar.stop().await;
}

/// A list subscription on a key that is not a list ends at once with FAILED_PRECONDITION,
/// rather than retrying a read that can never succeed, and leaves no companion keys behind.
async fn a_list_on_a_key_of_the_wrong_type_ends_with_failed_precondition(
    setup: &[&'static str],
    key: &str,
    open: proto::Open,
) {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    raw(&inspect, setup[0], setup[1..].to_vec()).await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let ended = match Subscription::start(&mut client, subscribe_request::Kind::Open(open)).await {
        Err(status) => Ok(status),
        Ok(mut sub) => status_within(&mut sub, Duration::from_secs(5)).await,
    };
    match ended {
        Ok(status) => assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}"),
        Err(seen) => panic!(
            "the subscription on {key:?} ({}) did not end within 5 s; it got {seen:?}",
            setup[0]
        ),
    }
    let companions = companion_keys(&inspect, key).await;
    assert!(companions.is_empty(), "companion keys left: {companions:?}");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_reliable_list_on_a_key_of_the_wrong_type_ends_with_failed_precondition() {
    let open = reliable("k1", "c", 1, Duration::from_secs(30));
    a_list_on_a_key_of_the_wrong_type_ends_with_failed_precondition(
        &["SET", "k1", "x"],
        "k1",
        open,
    )
    .await;
}

#[tokio::test]
async fn a_simple_list_on_a_key_of_the_wrong_type_ends_with_failed_precondition() {
    a_list_on_a_key_of_the_wrong_type_ends_with_failed_precondition(
        &["HSET", "k2", "f", "v"],
        "k2",
        simple("k2", 1),
    )
    .await;
}

/// Opens `open`, lets its read block, closes the client's stream, and has `add` put one entry
/// in while that last read is still blocked: the entry reaches the closing subscription's
/// reader, never its client. Reopened with the same consumer, the entry's first delivery to a
/// client must count 1.
async fn an_entry_taken_by_a_closing_subscription_counts_no_delivery(
    open: proto::Open,
    add: impl AsyncFnOnce(&Client),
) {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut first, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    // Long enough for the first read to be blocked in Redis, well within its 2 s BLOCK.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Once the stream has ended nothing can reach this client; the read is still blocked.
    close_and_wait(&mut first).await;
    add(&inspect).await;
    let (mut second, _) = Subscription::open(&mut client, open).await.unwrap();
    let d = second.read().await.deliveries.remove(0);
    assert_eq!(
        d.delivery_count, 1,
        "the entry no client ever saw was counted as a delivery: {d:?}"
    );
    second.send(vec![], vec![outcome(d.slot, Ack)]).await;
    assert!(second.flush().await.ok);
    drop(second);
    sidecar.stop().await;
}

fn block_two_seconds(open: proto::Open) -> proto::Open {
    proto::Open {
        block: Some(duration(Duration::from_secs(2))),
        ..open
    }
}

#[tokio::test]
async fn an_entry_taken_by_a_closing_stream_subscriptions_last_read_counts_no_delivery() {
    let open = block_two_seconds(stream_open("orders", "g", "c", 1));
    an_entry_taken_by_a_closing_subscription_counts_no_delivery(open, async |inspect| {
        raw(inspect, "XADD", vec!["orders", "*", "n", "1"]).await;
    })
    .await;
}

#[tokio::test]
async fn an_entry_taken_by_a_closing_reliable_list_subscriptions_last_read_counts_no_delivery() {
    let open = block_two_seconds(reliable("jobs", "c", 1, Duration::from_secs(30)));
    an_entry_taken_by_a_closing_subscription_counts_no_delivery(open, async |inspect| {
        let _: i64 = inspect.lpush("jobs", "late").await.unwrap();
    })
    .await;
}

/// Recovery is paced by `--reclaim-interval`: a consumer waiting in a long blocking read
/// still recovers a dead consumer's entries on time.
#[tokio::test]
async fn a_dead_consumers_list_entries_are_recovered_every_reclaim_interval_not_every_block() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "1s"]).await;
    let mut client = sidecar.client().await;
    // BLOCK unset: the default 5 s.
    let open = proto::Open {
        block: None,
        ..reliable("jobs", "b", 1, Duration::from_secs(2))
    };
    let (mut b, _) = Subscription::open(&mut client, open).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A dead consumer: a processing list and its membership, no heartbeat.
    let _: i64 = inspect
        .rpush("{jobs}:window:processing:dead", "stranded")
        .await
        .unwrap();
    let _: i64 = inspect
        .sadd("{jobs}:window:consumers", "dead")
        .await
        .unwrap();
    let created = Instant::now();
    let deadline = created + Duration::from_millis(2500);
    let mut received = None;
    while received.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_within(&mut b, left).await {
            None => break,
            Some(Ok(Some(Kind::Read(read)))) => {
                if read.deliveries.iter().any(|d| payload(d) == "stranded") {
                    received = Some(created.elapsed());
                }
                let acks = read.deliveries.iter().map(|d| outcome(d.slot, Ack));
                b.send(vec![], acks.collect()).await;
            }
            Some(Ok(Some(_))) => {}
            Some(other) => panic!("the stream ended: {other:?}"),
        }
    }
    assert!(
        received.is_some(),
        "the dead consumer's entry was not recovered within 2.5 s (reclaim interval 1 s); \
         on the list: {}, on its processing list: {}",
        len(&inspect, "jobs").await,
        len(&inspect, "{jobs}:window:processing:dead").await
    );
    drop(b);
    sidecar.stop().await;
}

/// A group deleted under a running subscription is an operator's decision: recreating it at
/// the start of the stream would deliver every settled entry again.
#[tokio::test]
async fn deleting_the_consumer_group_under_a_running_subscription_replays_nothing() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let ids = publish(&mut client, "orders", numbered(5)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 5))
        .await
        .unwrap();
    let mut delivered = 0;
    let mut settled = 0;
    while settled < 5 {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => {
                delivered += read.deliveries.len();
                let acks = read.deliveries.iter().map(|d| outcome(d.slot, Ack));
                sub.send(vec![], acks.collect()).await;
            }
            Some(Kind::Flush(report)) => {
                assert!(report.ok, "{report:?}");
                settled += report.settles;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(delivered, 5);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);

    raw(&inspect, "XGROUP", vec!["DESTROY", "orders", "g"]).await;
    let mut replayed = Vec::new();
    let mut ended = None;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_within(&mut sub, left).await {
            None => break,
            Some(Ok(Some(Kind::Read(read)))) => {
                replayed.extend(
                    read.deliveries
                        .iter()
                        .map(|d| d.entry_id.clone())
                        .filter(|id| ids.contains(id)),
                );
                let acks = read.deliveries.iter().map(|d| outcome(d.slot, Ack));
                sub.send(vec![], acks.collect()).await;
            }
            Some(Ok(Some(_))) => {}
            Some(Ok(None)) => break,
            Some(Err(status)) => {
                ended = Some(status);
                break;
            }
        }
    }
    assert!(
        replayed.is_empty(),
        "acked entries were delivered again after the group was deleted: {replayed:?}"
    );
    let status = ended.expect("the stream ends with a status within 5 s");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    sidecar.stop().await;
}

/// One consumer name reads a source on one subscription at a time across sidecars too: two
/// readers with one name would read each other's pending entries. The second open is refused
/// while the first holds the name, and succeeds once it has let it go.
async fn a_consumer_name_is_a_lease_across_sidecars(open: proto::Open) {
    let redis = RedisServer::start();
    let flags = ["--consumer-name", "same"];
    let one = Sidecar::start(&redis.url(), &flags).await;
    let two = Sidecar::start(&redis.url(), &flags).await;
    let mut client_one = one.client().await;
    let mut client_two = two.client().await;
    let (mut first, opened) = Subscription::open(&mut client_one, open.clone())
        .await
        .unwrap();
    assert_eq!(opened.consumer, "same");

    let second = try_open(&mut client_two, open.clone(), Duration::from_secs(5)).await;
    match second {
        Err(status) => assert_eq!(status.code(), Code::AlreadyExists, "{status:?}"),
        Ok((_, opened)) => panic!(
            "a second sidecar opened consumer {:?} while the first sidecar's subscription holds it",
            opened.consumer
        ),
    }

    close_and_wait(&mut first).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    let reopened = loop {
        match try_open(&mut client_two, open.clone(), Duration::from_secs(5)).await {
            Ok((sub, opened)) => break Ok((sub, opened)),
            Err(status) if status.code() == Code::AlreadyExists && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => break Err(status),
        }
    };
    match reopened {
        Ok((sub, opened)) => {
            assert_eq!(opened.consumer, "same");
            drop(sub);
        }
        Err(status) => panic!("the name was not released within 3 s: {status:?}"),
    }
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn a_stream_consumer_name_is_a_lease_across_sidecars() {
    // An empty consumer: both sidecars fill in their --consumer-name.
    a_consumer_name_is_a_lease_across_sidecars(stream_open("orders", "g", "", 1)).await;
}

#[tokio::test]
async fn a_reliable_list_consumer_name_is_a_lease_across_sidecars() {
    let open = reliable("jobs", "same", 1, Duration::from_secs(30));
    a_consumer_name_is_a_lease_across_sidecars(open).await;
}

/// Flushes leave in the order reads complete, whatever their ids: reads completed 3, 1, 2
/// flush 3, 1, 2 (and their side effects land in that order).
#[tokio::test]
async fn flushes_leave_in_the_order_their_reads_completed() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;
    let open = proto::Open {
        max_in_flight: 3,
        ..stream_open("orders", "g", "c", 1)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let mut reads = Vec::new();
    while reads.len() < 3 {
        reads.push(sub.read().await);
    }
    for i in [2, 0, 1] {
        let d = &reads[i].deliveries[0];
        let n = field(d, "n");
        sub.send(
            vec![command(d.slot, "RPUSH", &["log", &n])],
            vec![outcome(d.slot, Ack)],
        )
        .await;
    }
    let mut flushed = Vec::new();
    while flushed.len() < 3 {
        let report = sub.flush().await;
        assert!(report.ok, "{report:?}");
        flushed.push(report.read_id);
    }
    let ids: Vec<u64> = [2, 0, 1].iter().map(|&i| reads[i].read_id).collect();
    assert_eq!(flushed, ids, "flush reports in completion order");
    let log: Vec<String> = inspect.lrange("log", 0, -1).await.unwrap();
    assert_eq!(log, ["2", "0", "1"], "side effects in completion order");
    sidecar.stop().await;
}
