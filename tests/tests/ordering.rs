//! Ordering keys against a real Redis: a stream ordered by a raw field and a reliable list
//! ordered by a frame header hand out one delivery per key at a time, in the order read,
//! while other keys flow; a retry and a retry_after are kept in place (delivered again before
//! the key's later entries, counted, never copied); a simple list refuses the option.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::{Client, ClientLike, KeysInterface, ListInterface, StreamsInterface};
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::*;

/// Three keys, round-robin: entry `n` has key `KEYS[n % 3]`. The sidecar copies a key of up
/// to 38 bytes out of its read and shares the read's buffer for a longer one: both kinds run,
/// and the two long keys differ only past the first 38 bytes.
const KEYS: [&str; 3] = [
    "a",
    "customer-7f3c2a9e-1b4d-4c8a-9e2f-5a6b7c8d9e0f/region-eu-west-1",
    "customer-7f3c2a9e-1b4d-4c8a-9e2f-5a6b7c8d9e0f/region-us-east-1",
];
const ENTRIES: usize = 9;

/// What the worker did: each key's deliveries as (n, delivery count), in delivery order.
type Seen = BTreeMap<String, Vec<(usize, u32)>>;

/// The key and number of a delivery, from its raw fields or its headers and payload.
fn key_and_n(d: &proto::Delivery) -> (String, usize) {
    if let Some(k) = d.headers.get("k") {
        let n = String::from_utf8_lossy(&d.payload)
            .parse()
            .expect("payload n");
        return (k.clone(), n);
    }
    (field(d, "k"), field(d, "n").parse().expect("field n"))
}

/// Reads until every entry is acked. The first delivery of `n` = 2 is retried, of `n` = 3
/// retried after 50 ms; everything else is acked, a whole read at a time. Checks that no read
/// hands out a key whose earlier delivery is still out.
async fn work(sub: &mut Subscription) -> Seen {
    let mut seen = Seen::new();
    let mut acked = 0;
    while acked < ENTRIES {
        let read = sub.read().await;
        let mut keys_in_read = Vec::new();
        let mut outcomes = Vec::new();
        for d in &read.deliveries {
            let (key, n) = key_and_n(d);
            assert!(
                !keys_in_read.contains(&key),
                "two deliveries of key {key} out at once: {read:?}"
            );
            keys_in_read.push(key.clone());
            seen.entry(key).or_default().push((n, d.delivery_count));
            outcomes.push(match (n, d.delivery_count) {
                (2, 1) => outcome(d.slot, OutcomeKind::Retry),
                (3, 1) => retry_after(d.slot, Duration::from_millis(50)),
                _ => {
                    acked += 1;
                    outcome(d.slot, OutcomeKind::Ack)
                }
            });
        }
        if seen.values().map(Vec::len).sum::<usize>() == keys_in_read.len() {
            // The first read: every key's first entry goes out, and only that.
            assert_eq!(
                keys_in_read.len(),
                KEYS.len(),
                "one delivery per key in the first read: {read:?}"
            );
        }
        sub.send(Vec::new(), outcomes).await;
        assert!(sub.flush().await.ok);
    }
    seen
}

/// Each key's deliveries in the order read, the retried ones twice in their place.
fn expected() -> Seen {
    let mut seen = Seen::new();
    for n in 0..ENTRIES {
        let key = KEYS[n % 3].to_string();
        let again = [2, 3].contains(&n);
        seen.entry(key.clone()).or_default().push((n, 1));
        if again {
            seen.entry(key).or_default().push((n, 2));
        }
    }
    seen
}

fn ordered(mut open: proto::Open, key: proto::ordering_key::Source) -> proto::Open {
    open.ordering_key = Some(proto::OrderingKey { source: Some(key) });
    open
}

/// Done when: per key in stream order through a retry and a retry_after kept in place, other
/// keys flowing meanwhile; nothing copied to the end of the stream, nothing left pending.
#[tokio::test]
async fn a_stream_ordered_by_a_field_hands_out_each_key_in_order_and_retries_in_place() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let entries = (0..ENTRIES)
        .map(|n| vec![("k", KEYS[n % 3].to_string()), ("n", n.to_string())])
        .collect();
    publish(&mut client, "orders", entries).await;
    let open = ordered(
        stream_open("orders", "g", "w1", ENTRIES as u32),
        proto::ordering_key::Source::Field("k".into()),
    );
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();

    // The first read holds every key's later entries back: one delivery per key.
    assert_eq!(expected(), work(&mut sub).await);
    let len: u64 = inspect.xlen("orders").await.unwrap();
    assert_eq!(len, ENTRIES as u64, "a retry kept in place writes no copy");
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sub.close();
    sidecar.stop().await;
}

/// Done when: the same on a reliable list ordered by a frame header; the processing list
/// ends empty.
#[tokio::test]
async fn a_reliable_list_ordered_by_a_header_hands_out_each_key_in_order() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let entries = (0..ENTRIES)
        .map(|n| proto::PublishEntry {
            payload: Bytes::from(n.to_string()),
            headers: [("k".to_string(), KEYS[n % 3].to_string())].into(),
            ..Default::default()
        })
        .collect();
    client
        .publish(proto::PublishRequest {
            list: "jobs".into(),
            entries,
            ..Default::default()
        })
        .await
        .unwrap();
    let open = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "jobs".into(),
                consumer: "w1".into(),
                ..Default::default()
            },
        )),
        count: ENTRIES as u32,
        ..Default::default()
    };
    let open = ordered(open, proto::ordering_key::Source::Header("k".into()));
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    assert_eq!(expected(), work(&mut sub).await);
    let processing: i64 = inspect.llen("{jobs}:window:processing:w1").await.unwrap();
    assert_eq!(processing, 0, "every entry settled");
    let left: i64 = inspect.llen("jobs").await.unwrap();
    assert_eq!(left, 0, "a retry kept in place is not pushed back");
    let _: () = inspect.del("{jobs}:window:deliveries").await.unwrap();
    sub.close();
    sidecar.stop().await;
}

/// Done when: a simple list, a field key on a list and a key without its source are refused
/// at the open with INVALID_ARGUMENT and a message that says why.
#[tokio::test]
async fn ordering_keys_where_they_cannot_hold_are_refused_at_the_open() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let simple = proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: "jobs".into(),
        })),
        count: 4,
        ..Default::default()
    };
    let reliable = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "jobs".into(),
                ..Default::default()
            },
        )),
        count: 4,
        ..Default::default()
    };
    let header = proto::ordering_key::Source::Header("k".into());
    let field = proto::ordering_key::Source::Field("k".into());
    let mut unset = stream_open("orders", "g", "w1", 4);
    unset.ordering_key = Some(proto::OrderingKey { source: None });
    for (open, says) in [
        (ordered(simple, header), "for streams and reliable lists"),
        (
            ordered(reliable, field),
            "open.ordering_key.field is for streams",
        ),
        (unset, "open.ordering_key needs its source"),
    ] {
        let status = match Subscription::open(&mut client, open).await {
            Err(status) => status,
            Ok((mut sub, _)) => sub.status().await,
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    sidecar.stop().await;
}

/// Round trips that fetched parked entries back by id.
async fn fetches(metrics: std::net::SocketAddr) -> f64 {
    sample(
        &scrape(metrics).await,
        "window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"fetch\"}",
    )
}

/// A sidecar on `redis` whose metrics port (and admin view) is the address returned.
async fn with_metrics(redis: &RedisServer) -> (Sidecar, std::net::SocketAddr) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    (sidecar, metrics.parse().unwrap())
}

/// Done when: a slow key does not hold back a key read beside it. Key a's second entry waits
/// for its first, which shares a read with key s's slow one: acked, the first is flushed on
/// its own (a report of its own for the same read), and the second is delivered while the
/// slow one is still out.
#[tokio::test]
async fn a_slow_key_does_not_hold_back_a_key_read_beside_it() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let (sidecar, metrics) = with_metrics(&redis).await;
    let mut client = sidecar.client().await;
    let entries = [("a", 0), ("s", 1), ("a", 2)]
        .map(|(k, n)| vec![("k", k.to_string()), ("n", n.to_string())])
        .to_vec();
    publish(&mut client, "orders", entries).await;
    let open = ordered(
        stream_open("orders", "g", "w1", 3),
        proto::ordering_key::Source::Field("k".into()),
    );
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let first = sub.read().await;
    let got: Vec<_> = first.deliveries.iter().map(key_and_n).collect();
    assert_eq!(got, vec![("a".into(), 0), ("s".into(), 1)]);
    // The admin view and the gauge show a's second entry waiting (refreshed after the read
    // went out, so asked until they do).
    let series =
        "window_sidecar_waiting_for_key_entries{key=\"orders\",group=\"g\",consumer=\"w1\"}";
    let shown = eventually(STEP, || async {
        let view = http_get(metrics, "/subscriptions").await.1;
        let view: serde_json::Value = serde_json::from_str(&view).unwrap();
        view["subscriptions"][0]["waiting_for_key"] == 1
            && sample(&scrape(metrics).await, series) == 1.0
    })
    .await;
    assert!(shown, "{}", scrape(metrics).await);
    let (a0, slow) = (&first.deliveries[0], &first.deliveries[1]);
    sub.send(Vec::new(), vec![outcome(a0.slot, OutcomeKind::Ack)])
        .await;
    let early = sub.flush().await;
    assert!(early.ok);
    assert_eq!((early.read_id, early.settles), (first.read_id, 1));
    let next = sub.read().await;
    let got: Vec<_> = next.deliveries.iter().map(key_and_n).collect();
    assert_eq!(got, vec![("a".into(), 2)], "a's next while s is still out");
    let acks = vec![
        outcome(next.deliveries[0].slot, OutcomeKind::Ack),
        outcome(slow.slot, OutcomeKind::Ack),
    ];
    sub.send(Vec::new(), acks).await;
    assert!(sub.flush().await.ok);
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sub.close();
    sidecar.stop().await;
}

fn with_min_idle(mut open: proto::Open, idle: Duration) -> proto::Open {
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.min_idle = Some(prost_types::Duration::try_from(idle).unwrap());
    }
    open
}

/// Done when: entries waiting for their key stay this consumer's. A holds key a's first entry
/// for 2.6 s (extending it, as a client still working does) while a's next two wait in its
/// sidecar, far past the group's `min_idle` of 1 s; B, another consumer of the group on
/// another sidecar, reclaims every 200 ms and gets none of them (A's sidecar reclaims only
/// every minute, so only its extensions keep them); A then gets them in order.
#[tokio::test]
async fn entries_waiting_for_their_key_are_not_reclaimed_by_another_consumer() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "60s"]).await;
    let reclaimer = Sidecar::start(&redis.url(), &["--reclaim-interval", "200ms"]).await;
    let mut client = sidecar.client().await;
    let entries = [0, 1, 2]
        .map(|n| vec![("k", "a".to_string()), ("n", n.to_string())])
        .to_vec();
    publish(&mut client, "orders", entries).await;
    let idle = Duration::from_secs(1);
    let open = ordered(
        with_min_idle(stream_open("orders", "g", "a", 3), idle),
        proto::ordering_key::Source::Field("k".into()),
    );
    let (mut a, _) = Subscription::open(&mut client, open).await.unwrap();
    let first = a.read().await;
    let got: Vec<_> = first.deliveries.iter().map(key_and_n).collect();
    assert_eq!(got, vec![("a".into(), 0)]);
    let held = &first.deliveries[0];
    let mut other = reclaimer.client().await;
    let (mut b, _) = Subscription::open(
        &mut other,
        with_min_idle(stream_open("orders", "g", "b", 4), idle),
    )
    .await
    .unwrap();

    let until = tokio::time::Instant::now() + Duration::from_millis(2600);
    while tokio::time::Instant::now() < until {
        let extend = proto::subscribe_request::Kind::Batch(proto::Batch {
            extend: vec![held.slot],
            ..Default::default()
        });
        a.send_kind(extend).await;
        if let Some(message) = b.message_within(Duration::from_millis(300)).await {
            panic!("B took something of A's: {message:?}");
        }
    }
    let mut order = Vec::new();
    let mut slot = held.slot;
    for _ in 0..3 {
        a.send(Vec::new(), vec![outcome(slot, OutcomeKind::Ack)])
            .await;
        assert!(a.flush().await.ok);
        if order.len() == 2 {
            break;
        }
        let next = a.read().await;
        order.push(key_and_n(&next.deliveries[0]));
        slot = next.deliveries[0].slot;
    }
    assert_eq!(order, vec![("a".into(), 1), ("a".into(), 2)]);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    a.close();
    b.close();
    sidecar.stop().await;
    reclaimer.stop().await;
}

/// Done when: a client that leaves mid-key hands the key back in order. Key a's first entry
/// is out and its next two wait when the client goes away without an outcome; reopened with
/// the same consumer name, the subscription delivers a's first again (counted twice), then
/// the next two in order, each counted once: the waiting ones went back as never read.
#[tokio::test]
async fn a_client_that_leaves_mid_key_gets_the_key_back_in_order() {
    let seen = leave_mid_key(false).await;
    assert_eq!(seen, vec![(0, 2), (1, 1), (2, 1)]);
}

/// Done when: the entries a closing subscription gives back (here those waiting for their
/// key) take back only the delivery its own read counted. Another holder of the consumer name
/// re-read them meanwhile (as a subscription that took the name's lease over after it lapsed
/// would): their counts stay where that re-read left them, and the next delivery of each
/// counts past it, where an unfenced give-back lowered them below a delivery already made.
#[tokio::test]
async fn a_give_back_never_lowers_a_count_a_later_delivery_raised() {
    let seen = leave_mid_key(true).await;
    assert_eq!(seen, vec![(0, 3), (1, 3), (2, 3)]);
}

/// Done when: a retry kept in place counts its next delivery without lowering the count Redis
/// has. Another holder of the consumer name re-read the entry twice meanwhile (count 3): the
/// retry leaves 3, where setting its own next count (2) took a delivery back.
#[tokio::test]
async fn a_retry_kept_in_place_never_lowers_a_count_a_later_delivery_raised() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(
        &mut client,
        "orders",
        vec![vec![("k", "a".into()), ("n", "0".into())]],
    )
    .await;
    let open = ordered(
        stream_open("orders", "g", "w1", 1),
        proto::ordering_key::Source::Field("k".into()),
    );
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let d = sub.read().await.deliveries.remove(0);
    assert_eq!(d.delivery_count, 1);
    for _ in 0..2 {
        reread_pending_as_w1(&inspect).await;
    }
    sub.send(Vec::new(), vec![outcome(d.slot, OutcomeKind::Retry)])
        .await;
    assert!(sub.flush().await.ok);
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(again.entry_id, d.entry_id, "kept in place, delivered again");
    let rows: Vec<fred::types::Value> = inspect
        .custom(fred::cmd!("XPENDING"), vec!["orders", "g", "-", "+", "10"])
        .await
        .unwrap();
    let fred::types::Value::Array(row) = &rows[0] else {
        panic!("{rows:?}")
    };
    assert_eq!(row[3].as_u64(), Some(3), "{row:?}");
    sub.send(Vec::new(), vec![outcome(again.slot, OutcomeKind::Ack)])
        .await;
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sub.close();
    sidecar.stop().await;
}

/// Another holder of consumer w1's name re-reads its pending entries of "orders" (as a
/// subscription that took the name's lease over would): each counts one delivery more.
async fn reread_pending_as_w1(inspect: &Client) {
    let _: fred::types::Value = inspect
        .custom(
            fred::cmd!("XREADGROUP"),
            vec!["GROUP", "g", "w1", "STREAMS", "orders", "0"],
        )
        .await
        .unwrap();
}

/// Three entries of key a; the client takes the first and leaves without an outcome (the next
/// two wait for the key), after another holder of its consumer name re-read them when
/// `reread_between`; then it reopens and acks the key's entries one at a time. Returns each
/// delivery after the reopen as (n, delivery count); nothing is left pending.
async fn leave_mid_key(reread_between: bool) -> Vec<(usize, u32)> {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let entries = [0, 1, 2]
        .map(|n| vec![("k", "a".to_string()), ("n", n.to_string())])
        .to_vec();
    publish(&mut client, "orders", entries).await;
    let open = || {
        ordered(
            stream_open("orders", "g", "w1", 3),
            proto::ordering_key::Source::Field("k".into()),
        )
    };
    let (mut gone, _) = Subscription::open(&mut client, open()).await.unwrap();
    let first = gone.read().await;
    assert_eq!(first.deliveries.len(), 1, "1 and 2 wait for key a");
    if reread_between {
        // Each counts a second delivery.
        reread_pending_as_w1(&inspect).await;
    }
    gone.close();
    assert!(matches!(gone.next().await, Ok(None)));
    drop(gone);

    // The consumer name is free once the old subscription's last read returned.
    let (mut sub, _) = loop {
        match Subscription::open(&mut client, open()).await {
            Ok(opened) => break opened,
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let read = sub.read().await;
        assert_eq!(read.deliveries.len(), 1, "one of key a at a time");
        let d = &read.deliveries[0];
        seen.push((key_and_n(d).1, d.delivery_count));
        sub.send(Vec::new(), vec![outcome(d.slot, OutcomeKind::Ack)])
            .await;
        assert!(sub.flush().await.ok);
    }
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sub.close();
    sidecar.stop().await;
    seen
}

/// Done when: a hot key does not stop the reads. Key h holds every other entry and its first
/// delivery stays out while the client works through the rest: with `max_in_flight` 8, eight
/// of h's entries wait in memory and the other twelve are parked as ids, and every other
/// key's entry is delivered meanwhile. One parked entry is deleted from the stream: it is
/// settled, never delivered; another is reclaimed by another consumer: it stays theirs. Then
/// h's entries come in order, each counted once, fetched back by id (round trips of kind
/// `fetch`); nothing else is left pending.
#[tokio::test]
async fn past_a_fetchs_worth_a_hot_keys_entries_are_parked_and_the_other_keys_flow() {
    const N: usize = 42; // n even: key h; n odd: a key of its own.
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let (sidecar, metrics) = with_metrics(&redis).await;
    let mut client = sidecar.client().await;
    let entries = (0..N)
        .map(|n| {
            let key = if n % 2 == 0 {
                "h".into()
            } else {
                format!("k{n}")
            };
            vec![("k", key), ("n", n.to_string())]
        })
        .collect();
    publish(&mut client, "orders", entries).await;
    let mut open = ordered(
        stream_open("orders", "g", "w1", 4),
        proto::ordering_key::Source::Field("k".into()),
    );
    open.max_in_flight = 8;
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();

    let (mut others, mut hot, mut held) = (0, Vec::new(), None);
    while others < N / 2 {
        let read = sub.read().await;
        let mut acks = Vec::new();
        for d in &read.deliveries {
            match key_and_n(d) {
                (key, n) if key == "h" => {
                    assert!(held.is_none(), "two of h out at once");
                    held = Some(d.slot);
                    hot.push((n, d.delivery_count));
                }
                _ => {
                    others += 1;
                    acks.push(outcome(d.slot, OutcomeKind::Ack));
                }
            }
        }
        sub.send(Vec::new(), acks).await;
    }
    assert_eq!(hot, vec![(0, 1)], "h's first is out all along");
    let series =
        "window_sidecar_waiting_for_key_entries{key=\"orders\",group=\"g\",consumer=\"w1\"}";
    let shown = eventually(STEP, || async {
        sample(&scrape(metrics).await, series) == (N / 2 - 1) as f64
    })
    .await;
    assert!(shown, "{}", scrape(metrics).await);
    // Entry 30 is among the parked ones (h's entries 2 to 8 wait in memory: a fetch's worth).
    let all: Vec<(String, std::collections::HashMap<String, String>)> =
        inspect.xrange("orders", "-", "+", None).await.unwrap();
    let id = |n: &str| all.iter().find(|(_, f)| f["n"] == n).unwrap().0.clone();
    let _: u64 = inspect.xdel("orders", id("30")).await.unwrap();
    // Entry 32 is reclaimed by another consumer, as XAUTOCLAIM would once it was idle enough:
    // it is theirs now, not fetched for this one.
    let _: fred::types::Value = inspect
        .custom(
            fred::cmd!("XCLAIM"),
            vec![
                "orders".to_owned(),
                "g".into(),
                "thief".into(),
                "0".into(),
                id("32"),
            ],
        )
        .await
        .unwrap();

    let mut slot = held.take().unwrap();
    loop {
        sub.send(Vec::new(), vec![outcome(slot, OutcomeKind::Ack)])
            .await;
        if hot.last() == Some(&(N - 2, 1)) {
            break;
        }
        let read = sub.read().await;
        assert_eq!(read.deliveries.len(), 1, "one of h at a time: {read:?}");
        let d = &read.deliveries[0];
        hot.push((key_and_n(d).1, d.delivery_count));
        slot = d.slot;
    }
    let expected: Vec<_> = (0..N)
        .step_by(2)
        .filter(|n| ![30, 32].contains(n))
        .map(|n| (n, 1))
        .collect();
    assert_eq!(hot, expected);
    let settled = eventually(STEP, || async {
        pending(&inspect, "orders", "g").await == 1
    })
    .await;
    let left = pending(&inspect, "orders", "g").await;
    assert!(
        settled,
        "{left} left pending: only the thief's entry 32 should be"
    );
    let fetches = fetches(metrics).await;
    assert!(
        fetches >= 3.0,
        "16 parked, fetched 4 at a time: {fetches} fetches"
    );
    sub.close();
    sidecar.stop().await;
}

/// Many keys busy at once with an entry or two waiting each (a window larger than the keys
/// in flight, a client that settles each read at once): nothing is parked and fetched back by
/// a round trip of its own, where parking them would cost a fetch for nearly every entry.
/// Each key's entries come in order, one at a time. Under the backlog the reads go on the
/// subscription's read lane, each a round trip of its own (kind `read`).
#[tokio::test]
async fn keys_busy_with_few_entries_each_wait_in_memory_unparked() {
    const N: usize = 100_000;
    const KEYS: usize = 1000;
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let (sidecar, metrics) = with_metrics(&redis).await;
    let mut client = sidecar.client().await;
    let entries: Vec<_> = (0..N)
        .map(|n| vec![("k", format!("k{}", n % KEYS)), ("n", n.to_string())])
        .collect();
    for part in entries.chunks(10_000) {
        publish(&mut client, "orders", part.to_vec()).await;
    }
    let mut open = ordered(
        stream_open("orders", "g", "w1", 64),
        proto::ordering_key::Source::Field("k".into()),
    );
    open.max_in_flight = 1024;
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();

    // Each delivery's side effect appends its n to its key's list: the lists show the order
    // the deliveries ran in.
    let mut acked = 0;
    while acked < N {
        let read = sub.read().await;
        let (mut commands, mut outcomes) = (Vec::new(), Vec::new());
        let mut keys = std::collections::HashSet::new();
        for d in &read.deliveries {
            let (key, n) = key_and_n(d);
            let list = format!("order:{key}");
            commands.push(command(d.slot, "RPUSH", &[&list, &n.to_string()]));
            outcomes.push(outcome(d.slot, OutcomeKind::Ack));
            assert!(keys.insert(key), "a key twice in one read");
        }
        acked += outcomes.len();
        sub.send(commands, outcomes).await;
    }
    let settled = eventually(STEP, || async {
        pending(&inspect, "orders", "g").await == 0
    })
    .await;
    assert!(settled, "entries left pending");
    for k in 0..KEYS {
        let ran: Vec<usize> = inspect.lrange(format!("order:k{k}"), 0, -1).await.unwrap();
        let wanted: Vec<usize> = (k..N).step_by(KEYS).collect();
        assert_eq!(ran, wanted, "key k{k}: each once, in stream order");
    }
    let fetches = fetches(metrics).await;
    assert_eq!(fetches, 0.0, "nothing parked, nothing fetched back");
    let text = scrape(metrics).await;
    let aheads = sample(&text, "window_sidecar_read_aheads_total{form=\"stream\"}");
    let reads = sample(
        &text,
        "window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"read\"}",
    );
    assert!(
        aheads >= (N / 128) as f64,
        "{aheads} reads ahead of the reader for {N} entries read at most 128 at a time"
    );
    assert!(
        reads >= aheads,
        "{reads} read round trips for {aheads} reads on the lane"
    );
    sub.close();
    sidecar.stop().await;
}
