//! Sharing keys with ruststream-fred services: the retry counts ruststream-fred writes on its
//! copies count against the sidecar's cap, list values and messages travel in ruststream-fred's
//! frame, and a real ruststream-fred service and sidecar clients consume the same keys.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::{Client, ListInterface, PubsubInterface, StreamsInterface, Value};
use ruststream::runtime::RETRY_COUNT_HEADER;
use ruststream_fred::prelude::*;
use window_sidecar::domain::frame;
use window_sidecar::proto::OutcomeKind::{Ack, Retry};
use window_sidecar::proto::{self, subscribe_response::Kind};
use window_sidecar_harness::*;

/// The fields of every entry of a stream, in order.
async fn entries(client: &Client, key: &str) -> Vec<HashMap<String, String>> {
    let rows: Vec<(String, HashMap<String, String>)> =
        client.xrange(key, "-", "+", None).await.unwrap();
    rows.into_iter().map(|(_, fields)| fields).collect()
}

/// An entry ruststream-fred retried twice (`x-ruststream-retry-count` 2) is on its third
/// delivery; at `max_deliveries` 3 the sidecar's retry sends it to the dead letter, which says
/// 3 in both counts. The sidecar's own retry appends no copy: the entry stays pending in its
/// group and comes back, the same id, counted once more.
#[tokio::test]
async fn retry_counts_hold_across_ruststream_fred_and_the_sidecar() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let theirs: String = inspect
        .xadd(
            "orders",
            false,
            None,
            "*",
            vec![("_payload", "a"), ("h:x-ruststream-retry-count", "2")],
        )
        .await
        .unwrap();
    let fresh: String = inspect
        .xadd("orders", false, None, "*", vec![("_payload", "b")])
        .await
        .unwrap();
    let open = proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..stream_open("orders", "g", "c", 2)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = sub.read().await;
    let counts: Vec<(String, u32)> = read
        .deliveries
        .iter()
        .map(|d| (d.entry_id.clone(), d.delivery_count))
        .collect();
    assert_eq!(counts, [(theirs, 3), (fresh.clone(), 1)]);
    let retries = read.deliveries.iter().map(|d| outcome(d.slot, Retry));
    sub.send(vec![], retries.collect()).await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.dead_lettered, 1);

    let dead = entries(&inspect, "orders:dead").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["_payload"], "a");
    assert_eq!(dead[0]["h:x-ruststream-retry-count"], "3");
    assert_eq!(dead[0]["h:x-window-deliveries"], "3");
    let stream = entries(&inspect, "orders").await;
    assert_eq!(stream.len(), 2, "no copy appended: {stream:?}");
    // The same entry comes back as its second delivery.
    let again = loop {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => break read,
            Some(_) => {}
            None => panic!("the stream ended"),
        }
    };
    assert_eq!(again.deliveries[0].entry_id, fresh);
    assert_eq!(again.deliveries[0].delivery_count, 2);
    sidecar.stop().await;
}

/// What a ruststream-fred handler or a sidecar client saw of one delivery.
#[derive(Clone, Debug)]
struct Seen {
    form: &'static str,
    n: u32,
    side: &'static str,
    attempt: u32,
    tenant: Option<String>,
}

/// Every delivery both sides saw in the shared-keys run under way (see `SHARED_KEYS`).
static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

#[derive(Debug, serde::Deserialize)]
struct Job {
    n: u32,
}

fn seen_by_ruststream(
    form: &'static str,
    job: &Job,
    headers: &ruststream::HeaderMap,
) -> HandlerOutcome {
    let earlier: u32 = headers
        .get_str(RETRY_COUNT_HEADER)
        .map_or(0, |c| c.parse().expect("a count"));
    SEEN.lock().unwrap().push(Seen {
        form,
        n: job.n,
        side: "ruststream-fred",
        attempt: earlier + 1,
        tenant: headers.get_str("tenant").map(str::to_owned),
    });
    HandlerOutcome::retry()
}

#[subscriber(RedisStream::new("shared:orders").group("g").consumer("rs").start_id(StreamStart::Beginning).block(Duration::from_millis(200)))]
async fn ruststream_order(job: &Job, ctx: &mut Context<'_>) -> HandlerOutcome {
    seen_by_ruststream("stream", job, ctx.headers())
}

#[subscriber(RedisList::new("shared:jobs").reliable().block(Duration::from_millis(200)))]
async fn ruststream_job(job: &Job, ctx: &mut Context<'_>) -> HandlerOutcome {
    seen_by_ruststream("list", job, ctx.headers())
}

/// A sidecar client that retries everything it gets, recording each delivery.
async fn retry_everything(mut sub: Subscription, form: &'static str) {
    while let Ok(Some(kind)) = sub.next().await {
        let Kind::Read(read) = kind else { continue };
        let mut outcomes = Vec::new();
        for d in &read.deliveries {
            let job: serde_json::Value = serde_json::from_slice(&d.payload).expect("JSON");
            SEEN.lock().unwrap().push(Seen {
                form,
                n: job["n"].as_u64().expect("n") as u32,
                side: "sidecar",
                attempt: d.delivery_count,
                tenant: d.headers.get("tenant").cloned(),
            });
            outcomes.push(outcome(d.slot, Retry));
        }
        sub.send(vec![], outcomes).await;
    }
}

/// ruststream-fred services and sidecar clients sharing keys is one run at a time: the
/// services' handlers record into the one `SEEN`.
static SHARED_KEYS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A dead letter's `n` and fields.
type Letter = (u32, HashMap<String, String>);

/// What a shared-keys run left: ruststream-fred services and sidecar clients consumed the same
/// stream through one group and the same reliable list, and retried everything, until every
/// entry of each was dead-lettered.
struct SharedRun {
    /// Every delivery either side saw.
    seen: Vec<Seen>,
    /// The dead letters of the stream and of the list, each sorted by `n`.
    dead_letters: [(&'static str, Vec<Letter>); 2],
    /// `XPENDING` of the stream's group.
    pending: Value,
    /// The list, ruststream-fred's processing list and the sidecar's.
    lists_left: (u64, u64, u64),
    /// What the dead-letter service lists of the stream's and the list's dead letters.
    listed: Vec<(
        proto::dead_letter_target::Kind,
        proto::ListDeadLettersResponse,
    )>,
}

/// Entries of each form in a shared-keys run.
const N: u32 = 20;

impl SharedRun {
    async fn run() -> SharedRun {
        let _one_at_a_time = SHARED_KEYS.lock().await;
        SEEN.lock().unwrap().clear();
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let mut client = sidecar.client().await;
        let app = RustStream::new(AppInfo::new("interop", "0.1.0"))
            .with_broker(RedisBroker::standalone(redis.url()), |b| {
                b.include(ruststream_order)
                    .max_attempts(nonzero!(3u32))
                    .dead_letter("shared:orders:dead");
                b.include(ruststream_job)
                    .max_attempts(nonzero!(3u32))
                    .dead_letter("shared:jobs:dead");
            })
            .start()
            .await
            .expect("the ruststream-fred service starts");
        let workers = retry_everything_capped(&mut client).await;

        // Both sides are reading before the first entry arrives, so neither takes them all.
        tokio::time::sleep(Duration::from_millis(300)).await;
        publish_jobs(&mut client).await;
        until_every_entry_is_dead_lettered(&inspect).await;
        // Anything still on its way would show up as a fourth delivery or a second dead
        // letter.
        tokio::time::sleep(Duration::from_millis(800)).await;
        app.shutdown().await.expect("the service stops");
        for worker in workers {
            worker.abort();
        }

        let seen = SEEN.lock().unwrap().clone();
        let dead_letters = [
            ("stream", stream_dead_letters(&inspect).await),
            ("list", list_dead_letters(&inspect).await),
        ];
        let pending: Value = inspect.xpending("shared:orders", "g", ()).await.unwrap();
        let left: u64 = inspect.llen("shared:jobs").await.unwrap();
        let theirs: u64 = inspect.llen("shared:jobs.processing").await.unwrap();
        let ours: u64 = inspect
            .llen("{shared:jobs}:window:processing:sc")
            .await
            .unwrap();
        let listed = listed_by_the_service(&sidecar).await;
        sidecar.stop().await;
        SharedRun {
            seen,
            dead_letters,
            pending,
            lists_left: (left, theirs, ours),
            listed,
        }
    }
}

/// Opens the sidecar's subscriptions to the shared stream and list, capped at 3 deliveries with
/// the dead letters ruststream-fred writes to, each retrying everything it gets.
async fn retry_everything_capped(
    client: &mut proto::window_service_client::WindowServiceClient<tonic::transport::Channel>,
) -> [tokio::task::JoinHandle<()>; 2] {
    let capped = |open: proto::Open, dead_letter| proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(dead_letter),
        }),
        ..open
    };
    let stream = capped(
        stream_open("shared:orders", "g", "sc", 4),
        proto::dead_letter::Target::Stream("shared:orders:dead".into()),
    );
    let list = capped(
        proto::Open {
            source: Some(proto::open::Source::ReliableList(
                proto::ReliableListSource {
                    key: "shared:jobs".into(),
                    consumer: "sc".into(),
                    ..Default::default()
                },
            )),
            ..stream_open("-", "-", "-", 4)
        },
        proto::dead_letter::Target::List("shared:jobs:dead".into()),
    );
    let (stream_sub, _) = Subscription::open(client, stream).await.unwrap();
    let (list_sub, _) = Subscription::open(client, list).await.unwrap();
    [
        tokio::spawn(retry_everything(stream_sub, "stream")),
        tokio::spawn(retry_everything(list_sub, "list")),
    ]
}

/// `N` jobs into the stream and `N` into the list, through the sidecar, each with a header
/// (the list's values framed because of it).
async fn publish_jobs(
    client: &mut proto::window_service_client::WindowServiceClient<tonic::transport::Channel>,
) {
    let jobs = |n: std::ops::Range<u32>| -> Vec<proto::PublishEntry> {
        n.map(|n| proto::PublishEntry {
            payload: format!("{{\"n\":{n}}}").into(),
            headers: [("tenant".to_owned(), "acme".to_owned())].into(),
            ..Default::default()
        })
        .collect()
    };
    client
        .publish(proto::PublishRequest {
            stream: "shared:orders".into(),
            entries: jobs(0..N),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .publish(proto::PublishRequest {
            list: "shared:jobs".into(),
            entries: jobs(0..N),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn until_every_entry_is_dead_lettered(inspect: &Client) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let streamed: u64 = inspect.xlen("shared:orders:dead").await.unwrap();
        let listed: u64 = inspect.llen("shared:jobs:dead").await.unwrap();
        if streamed == u64::from(N) && listed == u64::from(N) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead letters: {streamed} on the stream, {listed} on the list, of {N} each; seen: {:?}",
            SEEN.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The job's `n` of a dead letter's fields.
fn letter(fields: HashMap<String, String>) -> Letter {
    let job: serde_json::Value = serde_json::from_str(&fields["_payload"]).unwrap();
    (job["n"].as_u64().unwrap() as u32, fields)
}

async fn stream_dead_letters(inspect: &Client) -> Vec<Letter> {
    let mut dead: Vec<Letter> = entries(inspect, "shared:orders:dead")
        .await
        .into_iter()
        .map(letter)
        .collect();
    dead.sort_by_key(|(n, _)| *n);
    dead
}

/// The list's dead letters, each a value in ruststream-fred's frame.
async fn list_dead_letters(inspect: &Client) -> Vec<Letter> {
    let values: Vec<Bytes> = inspect.lrange("shared:jobs:dead", 0, -1).await.unwrap();
    let mut listed: Vec<Letter> = values
        .iter()
        .map(|value| {
            letter(
                frame::decode(value)
                    .expect("a framed dead letter")
                    .into_iter()
                    .map(|(f, v)| {
                        (
                            String::from_utf8_lossy(&f).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    listed.sort_by_key(|(n, _)| *n);
    listed
}

async fn listed_by_the_service(
    sidecar: &Sidecar,
) -> Vec<(
    proto::dead_letter_target::Kind,
    proto::ListDeadLettersResponse,
)> {
    let mut admin = proto::dead_letter_service_client::DeadLetterServiceClient::connect(format!(
        "http://{}",
        sidecar.addr
    ))
    .await
    .unwrap();
    let mut listed = Vec::new();
    for target in [
        proto::dead_letter_target::Kind::Stream("shared:orders:dead".into()),
        proto::dead_letter_target::Kind::List("shared:jobs:dead".into()),
    ] {
        let response = admin
            .list_dead_letters(proto::ListDeadLettersRequest {
                target: Some(proto::DeadLetterTarget {
                    kind: Some(target.clone()),
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        listed.push((target, response));
    }
    listed
}

/// Whichever side gets a copy, each entry of the shared stream and list is delivered exactly
/// three times (attempts 1, 2 and 3, each once), its headers intact; some change sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ruststream_fred_and_sidecar_clients_share_a_stream_and_a_list() {
    let run = SharedRun::run().await;
    let seen = &run.seen;
    for form in ["stream", "list"] {
        let mut crossed = 0;
        for n in 0..N {
            let mut of_n: Vec<&Seen> = seen.iter().filter(|s| s.form == form && s.n == n).collect();
            of_n.sort_by_key(|s| s.attempt);
            let attempts: Vec<u32> = of_n.iter().map(|s| s.attempt).collect();
            assert_eq!(attempts, [1, 2, 3], "{form} entry {n}: {of_n:?}");
            assert!(
                of_n.iter().all(|s| s.tenant.as_deref() == Some("acme")),
                "{form} entry {n} lost its header: {of_n:?}"
            );
            if of_n.windows(2).any(|w| w[0].side != w[1].side) {
                crossed += 1;
            }
        }
        assert!(
            crossed > 0,
            "no {form} entry went from one side to the other: {seen:?}"
        );
        eprintln!("{form}: {crossed} of {N} entries changed sides between attempts");
    }
}

/// The caps hold across both sides: each entry's third failure goes to the shared dead letter
/// once, whichever side wrote it, saying 3 in ruststream-fred's count, its header kept; and
/// nothing is left pending or on a processing list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_caps_dead_letter_each_entry_once_and_leave_nothing_behind() {
    let run = SharedRun::run().await;
    for (form, letters) in &run.dead_letters {
        let ns: Vec<u32> = letters.iter().map(|(n, _)| *n).collect();
        assert_eq!(ns, (0..N).collect::<Vec<_>>(), "{form} dead letters");
        for (n, fields) in letters {
            assert_eq!(
                fields["h:x-ruststream-retry-count"], "3",
                "{form} {n}: {fields:?}"
            );
            assert_eq!(fields["h:tenant"], "acme", "{form} {n}: {fields:?}");
        }
    }
    assert_eq!(
        run.pending.clone().into_array()[0].as_u64(),
        Some(0),
        "pending entries left"
    );
    assert_eq!(run.lists_left, (0, 0, 0), "list, processing lists");
}

/// The dead-letter service reads both sides' dead letters alike: decoded, with the count each
/// wrote, the origin where the sidecar wrote it (ruststream-fred's do not say).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_service_reads_both_sides_dead_letters_alike() {
    let run = SharedRun::run().await;
    for (target, listed) in &run.listed {
        assert_eq!(listed.total, u64::from(N), "{target:?}");
        for letter in &listed.dead_letters {
            assert_eq!(letter.deliveries, 3, "{letter:?}");
            assert!(!letter.raw, "{letter:?}");
            assert!(letter.payload.starts_with(b"{\"n\":"), "{letter:?}");
            assert!(
                letter
                    .headers
                    .iter()
                    .any(|h| h.name == "tenant" && h.value == "acme"),
                "{letter:?}"
            );
            assert!(
                letter.origin.is_empty() || letter.origin.starts_with("shared:"),
                "{letter:?}"
            );
        }
    }
}

fn pubsub_open(channel: &str, framing: proto::Framing) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::Pubsub(proto::PubSubSource {
            channels: vec![channel.into()],
            ..Default::default()
        })),
        framing: framing as i32,
        ..stream_open("-", "-", "-", 4)
    }
}

/// The first two deliveries of a subscription, acked.
async fn two_deliveries(sub: &mut Subscription) -> Vec<proto::Delivery> {
    let mut got = Vec::new();
    while got.len() < 2 {
        let read = sub.read().await;
        let acks = read.deliveries.iter().map(|d| outcome(d.slot, Ack));
        sub.send(vec![], acks.collect()).await;
        got.extend(read.deliveries);
    }
    got
}

/// A message published with headers is a frame on the channel: a subscription that reads
/// frames gets payload and headers, one that reads raw gets the frame's bytes, and a message
/// another client published bare arrives as it is in both.
#[tokio::test]
async fn messages_in_the_frame_arrive_as_payload_and_headers_unless_read_raw() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut framed, _) = Subscription::open(
        &mut client,
        pubsub_open("news", proto::Framing::Unspecified),
    )
    .await
    .unwrap();
    let (mut raw, _) = Subscription::open(&mut client, pubsub_open("news", proto::Framing::Raw))
        .await
        .unwrap();
    let published = client
        .publish(proto::PublishRequest {
            channel: "news".into(),
            entries: vec![proto::PublishEntry {
                payload: "hello".into(),
                headers: [("lang".to_owned(), "en".to_owned())].into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(published.receivers, [2]);
    let _: i64 = inspect
        .publish("news", Bytes::from_static(b"\0\0\0\0bare"))
        .await
        .unwrap();

    let framed = two_deliveries(&mut framed).await;
    assert_eq!(framed[0].payload.as_ref(), b"hello");
    assert_eq!(framed[0].headers["lang"], "en");
    let mut wire = vec![0, 0, 0, 1, 0, 0, 0, 4];
    wire.extend_from_slice(b"lang");
    wire.extend_from_slice(&[0, 0, 0, 2]);
    wire.extend_from_slice(b"en");
    wire.extend_from_slice(b"hello");
    let raw = two_deliveries(&mut raw).await;
    assert_eq!(raw[0].payload.as_ref(), wire.as_slice());
    assert!(raw[0].headers.is_empty());
    // Four zero bytes are an empty frame to a reader of frames, and data to a raw reader.
    assert_eq!(framed[1].payload.as_ref(), b"bare");
    assert_eq!(raw[1].payload.as_ref(), b"\0\0\0\0bare");
    sidecar.stop().await;
}

/// A list publish writes a bare payload as it is and frames one with headers; a raw list
/// subscription takes both as they are, and its dead letters stay the values they were.
#[tokio::test]
async fn a_raw_list_keeps_values_as_they_are_and_framed_publishes_need_headers() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let entry = |payload: &str, headers: &[(&str, &str)]| proto::PublishEntry {
        payload: Bytes::copy_from_slice(payload.as_bytes()),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    client
        .publish(proto::PublishRequest {
            list: "raw:jobs".into(),
            entries: vec![entry("plain", &[]), entry("headed", &[("k", "v")])],
            ..Default::default()
        })
        .await
        .unwrap();
    let values: Vec<Bytes> = inspect.lrange("raw:jobs", 0, -1).await.unwrap();
    assert_eq!(values[1].as_ref(), b"plain");
    assert!(frame::decode(&values[0]).is_some(), "{values:?}");
    let refused = client
        .publish(proto::PublishRequest {
            list: "raw:jobs".into(),
            entries: vec![entry("headed", &[("k", "v")])],
            framing: proto::Framing::Raw as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("FRAMING_RAW"), "{refused:?}");

    let open = proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: "raw:jobs".into(),
        })),
        framing: proto::Framing::Raw as i32,
        max_deliveries: 1,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::List("raw:dead".into())),
        }),
        ..stream_open("-", "-", "-", 4)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = sub.read().await;
    let payloads: Vec<&[u8]> = read.deliveries.iter().map(|d| d.payload.as_ref()).collect();
    assert_eq!(payloads, [b"plain".as_slice(), values[0].as_ref()]);
    let retries = read.deliveries.iter().map(|d| outcome(d.slot, Retry));
    sub.send(vec![], retries.collect()).await;
    assert_eq!(sub.flush().await.dead_lettered, 2);
    let mut dead: Vec<Bytes> = inspect.lrange("raw:dead", 0, -1).await.unwrap();
    dead.reverse();
    assert_eq!(dead, [Bytes::from_static(b"plain"), values[0].clone()]);
    sidecar.stop().await;
}
