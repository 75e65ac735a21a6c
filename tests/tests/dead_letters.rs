//! The dead-letter admin service and the `window-sidecar dead-letters` command against a real
//! server: dead letters written by subscriptions of every form that has them (and in the
//! shapes ruststream-fred and plain producers leave), listed decoded, redriven back to their
//! origin with their counts reset (a stream's into its own consumer group only, as the entry it
//! was; one whose entry was trimmed, or whose group is gone, staying a dead letter), copies
//! written where `--to` says, purged, refused outside `--allow-keys`, a redrive killed
//! half-way that leaves each dead letter either still there or redriven once, redrives Redis
//! refuses (a destination of another type, no memory) that leave every dead letter in place,
//! ids that name one of several identical list dead letters, and the command's own answers:
//! its flags named, each dead letter printed as it is redriven, ids that are not there, and
//! each reason it cannot talk to a sidecar, with the sysexits code of each.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use tonic::Code;
use tonic::transport::Channel;
use window_sidecar::domain::frame;
use window_sidecar::proto::dead_letter_service_client::DeadLetterServiceClient;
use window_sidecar::proto::dead_letter_target::Kind as TargetKind;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::{
    Launch, Next, RedisServer, Sidecar, TlsMaterial, Worker, acl_user, connect_client, eventually,
    free_port, outcome, resp, sidecar_bin, stream_open, url_with_auth,
};

const REASON: &str = "card declined";

async fn admin(addr: &str) -> DeadLetterServiceClient<Channel> {
    // The same connection the window client waits for, so the sidecar is up.
    drop(connect_client(addr).await);
    DeadLetterServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn stream(key: &str) -> Option<proto::DeadLetterTarget> {
    Some(proto::DeadLetterTarget {
        kind: Some(TargetKind::Stream(key.into())),
    })
}

fn list(key: &str) -> Option<proto::DeadLetterTarget> {
    Some(proto::DeadLetterTarget {
        kind: Some(TargetKind::List(key.into())),
    })
}

fn all() -> Option<proto::DeadLetterSelection> {
    Some(proto::DeadLetterSelection {
        all: true,
        ..Default::default()
    })
}

/// Opens `open` with a cap of one delivery and `dead` as its dead letter, publishes nothing,
/// and retries every delivery with REASON until `n` went to the dead letter.
async fn dead_letter_through(addr: &str, mut open: proto::Open, dead: proto::DeadLetter, n: usize) {
    open.max_deliveries = 1;
    open.dead_letter = Some(dead);
    let mut worker = Worker::open(addr, open).await;
    let mut handled = 0;
    while handled < n {
        let read = worker.next_read().await;
        let mut batch = proto::Batch::default();
        for d in &read.deliveries {
            batch.outcomes.push(proto::Outcome {
                reason: REASON.into(),
                ..outcome(d.slot, OutcomeKind::Retry)
            });
        }
        handled += read.deliveries.len();
        worker.send(batch).await;
        worker
            .report_for(read.read_id, Duration::from_secs(5))
            .await;
    }
    worker.close();
}

fn stream_dead_letter(key: &str) -> proto::DeadLetter {
    proto::DeadLetter {
        target: Some(proto::dead_letter::Target::Stream(key.into())),
    }
}

fn list_dead_letter(key: &str) -> proto::DeadLetter {
    proto::DeadLetter {
        target: Some(proto::dead_letter::Target::List(key.into())),
    }
}

fn payloads(letters: &[proto::DeadLetterEntry]) -> Vec<String> {
    letters
        .iter()
        .map(|l| String::from_utf8_lossy(&l.payload).into_owned())
        .collect()
}

/// Runs `window-sidecar dead-letters ARGS` against the sidecar at `addr`: (exit code, stdout,
/// stderr).
fn cli(addr: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(sidecar_bin())
        .arg("dead-letters")
        .args(args)
        .env("WINDOW_SIDECAR_ADDR", addr)
        .env_remove("WINDOW_SIDECAR_TOKEN")
        .output()
        .expect("the sidecar binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Publishes `payloads` to `target`, which is a `PublishRequest` with its stream or list set.
async fn publish_payloads(addr: &str, target: proto::PublishRequest, payloads: &[&str]) {
    let mut client = connect_client(addr).await;
    let entries = payloads
        .iter()
        .map(|p| proto::PublishEntry {
            payload: Bytes::copy_from_slice(p.as_bytes()),
            ..Default::default()
        })
        .collect();
    client
        .publish(proto::PublishRequest { entries, ..target })
        .await
        .unwrap();
}

/// A sidecar whose subscription to `dl:orders` (group `billing`) retried "a", "b" and "c" past
/// their cap of one delivery: three dead letters on `dl:orders:dead`.
struct StreamDeadLetters {
    redis: RedisServer,
    client: Client,
    sidecar: Sidecar,
    addr: String,
}

impl StreamDeadLetters {
    async fn start() -> StreamDeadLetters {
        let redis = RedisServer::start();
        let client = redis.client().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let addr = sidecar.addr.to_string();
        let target = proto::PublishRequest {
            stream: "dl:orders".into(),
            ..Default::default()
        };
        publish_payloads(&addr, target, &["a", "b", "c"]).await;
        dead_letter_through(
            &addr,
            stream_open("dl:orders", "billing", "c1", 8),
            stream_dead_letter("dl:orders:dead"),
            3,
        )
        .await;
        StreamDeadLetters {
            redis,
            client,
            sidecar,
            addr,
        }
    }

    async fn listed(
        &self,
        admin: &mut DeadLetterServiceClient<Channel>,
    ) -> proto::ListDeadLettersResponse {
        admin
            .list_dead_letters(proto::ListDeadLettersRequest {
                target: stream("dl:orders:dead"),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
    }
}

/// Stream dead letters are listed with origin, count, reason and payload, by the service and
/// by the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_dead_letters_are_listed_with_their_origin_count_and_reason() {
    let on = StreamDeadLetters::start().await;
    let addr = &on.addr;
    let mut admin = admin(addr).await;
    let listed = on.listed(&mut admin).await;
    assert_eq!(listed.total, 3);
    assert_eq!(payloads(&listed.dead_letters), ["a", "b", "c"]);
    let first = &listed.dead_letters[0];
    assert_eq!(
        (first.origin.as_str(), first.origin_group.as_str()),
        ("dl:orders", "billing")
    );
    assert_eq!(first.deliveries, 1);
    assert_eq!(first.reason, REASON);
    assert!(first.age.is_some());
    assert!(
        first
            .headers
            .iter()
            .any(|h| h.name == "x-window-original-id")
    );

    // The command shows the same.
    let (code, out, err) = cli(addr, &["list", "stream:dl:orders:dead"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("from dl:orders (group billing)"), "{out}");
    assert!(out.contains("reason \"card declined\""), "{out}");
    assert!(out.contains("3 shown of 3 dead letters"), "{out}");
    let (code, out, _) = cli(addr, &["show", "stream:dl:orders:dead", &first.id]);
    assert_eq!(code, 0);
    assert!(out.contains("payload:    a"), "{out}");
    on.sidecar.stop().await;
}

/// Stream dead letters are redriven back into their group (the dry run changing nothing), one
/// by id and the rest by reason, and delivered again once each, as the entries they were, with
/// their counts reset; the stream gets no new entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_dead_letters_are_redriven_and_delivered_again_once() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let mut admin = admin(addr).await;
    let listed = on.listed(&mut admin).await;
    let first = &listed.dead_letters[0];

    // A dry run changes nothing.
    let (code, out, err) = cli(
        addr,
        &["redrive", "stream:dl:orders:dead", "--all", "--dry-run"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("3 of 3 dead letters would be redriven (dry run)"),
        "{out}"
    );
    let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(len, 3);
    assert!(
        out.contains(&format!(
            "would redrive {} back into group billing of dl:orders",
            first.id
        )),
        "{out}"
    );
    let origin_len: u64 = client.xlen("dl:orders").await.unwrap();

    // Redrive one by id, then the rest by reason.
    let (code, out, err) = cli(
        addr,
        &["redrive", "stream:dl:orders:dead", "--id", &first.id],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 of 1 dead letters redriven"), "{out}");
    let done = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: stream("dl:orders:dead"),
            selection: Some(proto::DeadLetterSelection {
                reason: "card*".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.redriven.len(), 2);
    let original = |id: &str| {
        let letter = listed.dead_letters.iter().find(|l| l.id == id).unwrap();
        let header = letter.headers.iter();
        let mut header = header.filter(|h| h.name == "x-window-original-id");
        String::from_utf8_lossy(&header.next().unwrap().value).into_owned()
    };
    for r in &done.redriven {
        assert!(r.skipped.is_empty(), "{r:?}");
        assert_eq!((r.to.as_str(), r.group.as_str()), ("dl:orders", "billing"));
        assert_eq!(r.new_id, original(&r.id), "back as the entry it was");
    }
    let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(len, 0, "every redriven dead letter left the dead letter");
    let len: u64 = client.xlen("dl:orders").await.unwrap();
    assert_eq!(len, origin_len, "no copy was appended");

    // Delivered again, once each, as first deliveries of the entries they were.
    let mut worker = Worker::open(addr, stream_open("dl:orders", "billing", "c1", 8)).await;
    let mut seen = HashMap::new();
    while seen.len() < 3 {
        let read = worker.next_read().await;
        for d in &read.deliveries {
            assert_eq!(d.delivery_count, 1, "the count restarts");
            assert!(
                listed
                    .dead_letters
                    .iter()
                    .any(|l| original(&l.id) == d.entry_id),
                "{d:?}"
            );
            assert!(!d.headers.contains_key("x-window-redriven"), "{d:?}");
            assert!(!d.headers.contains_key("x-window-reason"));
            *seen
                .entry(String::from_utf8_lossy(&d.payload).into_owned())
                .or_insert(0) += 1;
        }
        worker.ack(&read.deliveries).await;
    }
    assert_eq!(
        seen,
        HashMap::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)])
    );
    worker.close();
    on.sidecar.stop().await;
}

/// Stream dead letters are purged: a dry run says how many, then for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_dead_letters_are_purged() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    for p in ["x", "y"] {
        let _: String = client
            .xadd("dl:orders:dead", false, None, "*", vec![("_payload", p)])
            .await
            .unwrap();
    }
    let (_, out, _) = cli(
        &addr,
        &["purge", "stream:dl:orders:dead", "--all", "--dry-run"],
    );
    assert!(
        out.contains("2 dead letters would be purged (dry run)"),
        "{out}"
    );
    let (code, out, _) = cli(&addr, &["purge", "stream:dl:orders:dead", "--all"]);
    assert_eq!(code, 0);
    assert!(out.contains("2 dead letters purged"), "{out}");
    let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(len, 0);
    sidecar.stop().await;
}

/// `dl:jobs:dead` holding dead letters of both list forms, as frames (two of the reliable list
/// `dl:jobs`, one of the simple list `dl:mail`), then a value that is no frame (a producer's)
/// and a frame without the sidecar's origin header (the shape ruststream-fred's dead letters
/// have); and a sidecar with no list subscription to work on them.
struct ListDeadLetters {
    _redis: RedisServer,
    client: Client,
    sidecar: Sidecar,
    addr: String,
}

impl ListDeadLetters {
    async fn start() -> ListDeadLetters {
        let redis = RedisServer::start();
        let client = redis.client().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let addr = sidecar.addr.to_string();
        let reliable = proto::Open {
            source: Some(proto::open::Source::ReliableList(
                proto::ReliableListSource {
                    key: "dl:jobs".into(),
                    consumer: "w1".into(),
                    ..Default::default()
                },
            )),
            count: 4,
            block: Some(window_sidecar_harness::duration(Duration::from_millis(200))),
            ..Default::default()
        };
        let simple = proto::Open {
            source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
                key: "dl:mail".into(),
            })),
            ..reliable.clone()
        };
        let list_target = |k: &str| proto::PublishRequest {
            list: k.into(),
            ..Default::default()
        };
        publish_payloads(&addr, list_target("dl:jobs"), &["j1", "j2"]).await;
        dead_letter_through(&addr, reliable, list_dead_letter("dl:jobs:dead"), 2).await;
        publish_payloads(&addr, list_target("dl:mail"), &["m1"]).await;
        dead_letter_through(&addr, simple, list_dead_letter("dl:jobs:dead"), 1).await;
        // A closed list subscription still has its last blocking read under way, which would
        // take a redriven value as it arrives: the lists are worked on through a sidecar with
        // none.
        sidecar.stop().await;
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let addr = sidecar.addr.to_string();
        let _: i64 = client.lpush("dl:jobs:dead", "plain bytes").await.unwrap();
        let foreign = frame::encode(&[
            (Bytes::from_static(b"_payload"), Bytes::from_static(b"r1")),
            (
                Bytes::from_static(b"h:x-ruststream-retry-count"),
                Bytes::from_static(b"3"),
            ),
        ]);
        let _: i64 = client
            .lpush("dl:jobs:dead", foreign.to_vec())
            .await
            .unwrap();
        ListDeadLetters {
            _redis: redis,
            client,
            sidecar,
            addr,
        }
    }
}

/// List dead letters of both list forms are decoded; values that are no frame are shown raw
/// and never dropped, and a frame that says nothing of its origin shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dead_letters_of_both_forms_are_decoded() {
    let on = ListDeadLetters::start().await;
    let mut admin = admin(&on.addr).await;
    let listed = admin
        .list_dead_letters(proto::ListDeadLettersRequest {
            target: list("dl:jobs:dead"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert_eq!(payloads(&listed), ["j1", "j2", "m1", "plain bytes", "r1"]);
    assert_eq!(listed[0].origin, "dl:jobs");
    assert_eq!(listed[2].origin, "dl:mail");
    assert_eq!(listed[0].reason, REASON);
    assert!(listed[3].raw && listed[3].origin.is_empty());
    assert_eq!((listed[4].origin.as_str(), listed[4].deliveries), ("", 3));
    on.sidecar.stop().await;
}

/// List dead letters go back where they came from, marked redriven and with their count
/// reset; one that says nothing of its origin is skipped unless `to` names one, and a raw
/// value goes back as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dead_letters_are_redriven_to_their_origin_or_where_to_says() {
    let on = ListDeadLetters::start().await;
    let client = &on.client;
    let mut admin = admin(&on.addr).await;
    // Everything back where it came from; the two that do not say are skipped.
    let done = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: list("dl:jobs:dead"),
            selection: all(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let skipped: Vec<_> = done
        .redriven
        .iter()
        .filter(|r| !r.skipped.is_empty())
        .collect();
    assert_eq!(skipped.len(), 2, "{done:?}");
    assert!(skipped[0].skipped.contains("redrive it with `to`"));
    let jobs: Vec<Bytes> = client.lrange("dl:jobs", 0, -1).await.unwrap();
    let mail: Vec<Bytes> = client.lrange("dl:mail", 0, -1).await.unwrap();
    assert_eq!((jobs.len(), mail.len()), (2, 1));
    let copy = frame::decode(&mail[0]).expect("a frame");
    assert!(
        copy.iter()
            .any(|(f, _)| f.as_ref() == b"h:x-window-redriven")
    );
    assert!(
        !copy
            .iter()
            .any(|(f, _)| f.as_ref() == b"h:x-window-deliveries")
    );

    // The two without an origin go where `to` says.
    let done = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: list("dl:jobs:dead"),
            selection: all(),
            to: "dl:jobs".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.redriven.len(), 2);
    let jobs: Vec<Bytes> = client.lrange("dl:jobs", 0, -1).await.unwrap();
    assert_eq!(jobs.len(), 4);
    assert!(
        jobs.contains(&Bytes::from_static(b"plain bytes")),
        "a raw value goes back as it was"
    );
    let left: u64 = client.llen("dl:jobs:dead").await.unwrap();
    assert_eq!(left, 0);
    on.sidecar.stop().await;
}

/// `--allow-keys` holds for the admin service: a dead letter outside it is not read, and a
/// redrive to a key outside it is PERMISSION_DENIED naming the key, before anything moves.
/// Bad requests are INVALID_ARGUMENT saying what to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_service_keeps_to_the_allowed_keys_and_says_what_is_wrong() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let _: String = client
        .xadd(
            "app:dead",
            false,
            None,
            "*",
            vec![
                ("_payload", "p"),
                ("h:x-window-original-id", "1-0"),
                ("h:x-window-subscription", "secret:orders/g"),
            ],
        )
        .await
        .unwrap();
    let sidecar = Sidecar::start(&redis.url(), &["--allow-keys", "app:*"]).await;
    let addr = sidecar.addr.to_string();
    let mut admin = admin(&addr).await;
    let refused = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: stream("app:dead"),
            selection: all(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("secret:orders"),
        "{}",
        refused.message()
    );
    let len: u64 = client.xlen("app:dead").await.unwrap();
    assert_eq!(len, 1, "nothing moved");
    let refused = admin
        .list_dead_letters(proto::ListDeadLettersRequest {
            target: stream("other:dead"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("other:dead"));

    let no_selection = admin
        .purge_dead_letters(proto::PurgeDeadLettersRequest {
            target: stream("app:dead"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(no_selection.code(), Code::InvalidArgument);
    assert!(
        no_selection.message().contains("all: true"),
        "{}",
        no_selection.message()
    );
    let no_target = admin
        .list_dead_letters(proto::ListDeadLettersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(no_target.code(), Code::InvalidArgument);

    // The command says the same, naming the stream, and exits 77 (EX_NOPERM); a malformed
    // target is a usage error (64).
    let (code, _, err) = cli(&addr, &["redrive", "stream:app:dead", "--all"]);
    assert_eq!(code, 77, "{err}");
    assert!(
        err.contains("secret:orders")
            && err.contains("PermissionDenied")
            && err.contains("stream app:dead"),
        "{err}"
    );
    let (code, _, err) = cli(&addr, &["list", "app:dead"]);
    assert_eq!(code, 64, "{err}");
    let port = free_port();
    let (code, _, err) = cli(&format!("127.0.0.1:{port}"), &["list", "stream:app:dead"]);
    assert_eq!(code, 69, "{err}");
    assert!(
        err.contains(&format!(
            "No sidecar at 127.0.0.1:{port} (connection refused)"
        )),
        "{err}"
    );
    sidecar.stop().await;
}

/// A redrive whose sidecar is killed (SIGKILL) half-way leaves every dead letter either still
/// a dead letter or redriven exactly once; a second redrive finishes the job without doubles.
/// The redrive writes copies (`--to`), the one way a redrive adds entries that a crash could
/// double.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_killed_half_way_loses_and_doubles_nothing() {
    const N: usize = 300;
    let redis = RedisServer::start();
    let client = redis.client().await;
    for i in 0..N {
        let _: String = client
            .xadd(
                "kill:dead",
                false,
                None,
                "*",
                vec![
                    ("_payload", i.to_string()),
                    ("h:x-window-subscription", "kill:orders/g".to_owned()),
                ],
            )
            .await
            .unwrap();
    }
    let start = |listen: &str| {
        Launch::new()
            .args(["--redis-url", &redis.url(), "--listen", listen])
            .start()
    };
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&listen);
    drop(connect_client(&listen).await);
    let redrive = Command::new(sidecar_bin())
        .args([
            "dead-letters",
            "redrive",
            "stream:kill:dead",
            "--all",
            "--to",
            "kill:orders",
            "--rate",
            "300",
        ])
        .env("WINDOW_SIDECAR_ADDR", &listen)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Half-way at 300/s.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let moved: u64 = client.xlen("kill:orders").await.unwrap_or(0);
            moved >= 100
        })
        .await
    );
    sidecar.kill9();
    let redrive = redrive.wait_with_output().unwrap();

    let (moved, left) = each_redriven_once_or_still_dead(&client, N, false).await;
    assert!(
        moved > 0 && left > 0,
        "killed half-way: {moved} moved, {left} left"
    );
    // The command printed what it redrove before the sidecar went away, and says so.
    let (out, err) = (
        String::from_utf8_lossy(&redrive.stdout),
        String::from_utf8_lossy(&redrive.stderr),
    );
    let printed = redrove_lines(&out);
    assert!(!printed.is_empty(), "nothing printed: {err}");
    assert!(
        printed.len() <= moved,
        "{} printed, {moved} moved",
        printed.len()
    );
    still_dead_none_of(&client, "kill:dead", &printed).await;
    assert_eq!(redrive.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&format!("No sidecar at {listen}"))
            && err.contains(&format!(
                "{} of the {N} dead letters chosen were redriven before",
                printed.len()
            )),
        "{err}"
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = start(&listen);
    drop(connect_client(&listen).await);
    let (code, out, err) = cli(
        &listen,
        &[
            "redrive",
            "stream:kill:dead",
            "--all",
            "--to",
            "kill:orders",
            "--rate",
            "0",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("{left} of {left} dead letters redriven")),
        "{out}"
    );
    each_redriven_once_or_still_dead(&client, N, true).await;
    sidecar.terminate();
}

/// Each of the `n` dead letters of `kill:dead` is either still a dead letter or on
/// `kill:orders` exactly once (all moved, when `expect_all_moved`); returns how many moved and
/// how many are left.
async fn each_redriven_once_or_still_dead(
    client: &Client,
    n: usize,
    expect_all_moved: bool,
) -> (usize, usize) {
    let dead: Vec<(String, HashMap<String, String>)> =
        client.xrange("kill:dead", "-", "+", None).await.unwrap();
    let moved: Vec<(String, HashMap<String, String>)> =
        client.xrange("kill:orders", "-", "+", None).await.unwrap();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for (_, fields) in &moved {
        *copies.entry(fields["_payload"].clone()).or_default() += 1;
    }
    let still: Vec<String> = dead.iter().map(|(_, f)| f["_payload"].clone()).collect();
    for i in 0..n {
        let p = i.to_string();
        let (n, dead) = (copies.get(&p).copied().unwrap_or(0), still.contains(&p));
        assert!(
            (n == 1 && !dead) || (n == 0 && dead),
            "dead letter {p}: {n} copies, still a dead letter: {dead}"
        );
    }
    if expect_all_moved {
        assert!(still.is_empty());
    }
    (moved.len(), still.len())
}

/// The ids of `listed`.
fn ids(letters: &[proto::DeadLetterEntry]) -> Vec<String> {
    letters.iter().map(|l| l.id.clone()).collect()
}

async fn redrive_all(
    admin: &mut DeadLetterServiceClient<Channel>,
    target: Option<proto::DeadLetterTarget>,
) -> Vec<proto::Redriven> {
    admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target,
            selection: all(),
            per_second: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .redriven
}

/// A stream redrive Redis refuses (the destination holds a hash: WRONGTYPE) leaves every dead
/// letter in place and the destination untouched; the command names each refused dead letter
/// with Redis's error and exits 1, and the service reports, letter by letter, which moved and
/// which Redis refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_redrive_redis_refuses_leaves_the_dead_letters_in_place() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let mut admin = admin(addr).await;
    let before = ids(&on.listed(&mut admin).await.dead_letters);
    let _: i64 = client.hset("dl:totals", ("apple", 1)).await.unwrap();

    let (code, out, err) = cli(
        addr,
        &[
            "redrive",
            "stream:dl:orders:dead",
            "--all",
            "--to",
            "dl:totals",
        ],
    );
    let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(len, 3, "every dead letter is still there: {out}{err}");
    assert_eq!(ids(&on.listed(&mut admin).await.dead_letters), before);
    let totals: HashMap<String, String> = client.hgetall("dl:totals").await.unwrap();
    assert_eq!(totals, HashMap::from([("apple".into(), "1".into())]));
    assert_eq!(code, 1, "{out}{err}");
    for id in &before {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("refused {id}: ")))
            .unwrap_or_else(|| panic!("{id} is said to be refused: {out}"));
        assert!(line.contains("WRONGTYPE"), "{line}");
    }
    assert!(out.contains("0 of 3 dead letters redriven"), "{out}");
    assert!(err.contains("3 dead letters"), "{err}");

    // One whose origin is the hash among three that go home: those move, it stays.
    let odd: String = client
        .xadd(
            "dl:orders:dead",
            false,
            None,
            "*",
            vec![
                ("_payload", "d"),
                ("h:x-window-original-id", "1-0"),
                ("h:x-window-subscription", "dl:totals/billing"),
            ],
        )
        .await
        .unwrap();
    let done = redrive_all(&mut admin, stream("dl:orders:dead")).await;
    assert_eq!(done.len(), 4, "{done:?}");
    for moved in &done[..3] {
        assert!(
            moved.skipped.is_empty() && !moved.new_id.is_empty(),
            "{moved:?}"
        );
    }
    assert_eq!(done[3].id, odd);
    assert_eq!(
        (done[3].to.as_str(), done[3].group.as_str()),
        ("dl:totals", "billing")
    );
    assert!(done[3].new_id.is_empty());
    assert!(
        done[3].skipped.contains("WRONGTYPE") && done[3].skipped.contains("still a dead letter"),
        "{:?}",
        done[3].skipped
    );
    let left = on.listed(&mut admin).await.dead_letters;
    assert_eq!(ids(&left), [odd]);
    on.sidecar.stop().await;
}

/// A list redrive Redis refuses leaves the dead letters in place: redriven `--to` a string,
/// every one stays, byte for byte, and the command exits 1 naming each; when one's origin now
/// holds a string, it stays while the others move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_redrive_redis_refuses_leaves_the_dead_letters_in_place() {
    let on = ListDeadLetters::start().await;
    let client = &on.client;
    let mut admin = admin(&on.addr).await;
    let _: () = client
        .set("dl:mail", "a string now", None, None, false)
        .await
        .unwrap();
    let before: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(before.len(), 5);

    let (code, out, err) = cli(
        &on.addr,
        &["redrive", "list:dl:jobs:dead", "--all", "--to", "dl:mail"],
    );
    let after: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(
        after, before,
        "every dead letter is still there as it was: {out}{err}"
    );
    let mail: String = client.get("dl:mail").await.unwrap();
    assert_eq!(mail, "a string now");
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("refused ")).count(),
        5,
        "{out}"
    );
    assert!(out.contains("WRONGTYPE"), "{out}");
    assert!(out.contains("0 of 5 dead letters redriven"), "{out}");

    // Each to its origin: m1's is the string.
    let done = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    assert_eq!(done.len(), 5, "{done:?}");
    assert!(done[0].skipped.is_empty() && done[1].skipped.is_empty());
    assert_eq!(done[2].to, "dl:mail");
    assert!(
        done[2].skipped.contains("WRONGTYPE") && done[2].skipped.contains("still a dead letter"),
        "{:?}",
        done[2].skipped
    );
    assert!(done[3].skipped.contains("redrive it with `to`"));
    let dead: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 3, "m1 and the two without an origin stay");
    assert!(dead.iter().all(|v| before.contains(v)));
    let jobs: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!(jobs, 2);
    on.sidecar.stop().await;
}

/// Under `maxmemory` with `noeviction` Redis refuses the redrive whole, before it writes
/// anything: every dead letter, stream and list, stays; once Redis has memory again the same
/// redrive moves them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_refused_for_memory_leaves_the_dead_letters_in_place() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let port = on.redis.port();
    let frame = frame::encode(&[
        (Bytes::from_static(b"_payload"), Bytes::from_static(b"j1")),
        (
            Bytes::from_static(b"h:x-window-subscription"),
            Bytes::from_static(b"dl:jobs"),
        ),
    ]);
    let _: i64 = client.lpush("dl:jobs:dead", frame.to_vec()).await.unwrap();
    let origin_before: u64 = client.xlen("dl:orders").await.unwrap();
    let config = |args: &[&str]| {
        let mut call = vec!["CONFIG", "SET"];
        call.extend(args);
        let reply = resp::call(port, &call).unwrap();
        assert_eq!(reply.text(), "OK", "CONFIG SET {args:?}");
    };
    config(&["maxmemory-policy", "noeviction"]);
    config(&["maxmemory", "1"]);

    let (code, out, err) = cli(addr, &["redrive", "stream:dl:orders:dead", "--all"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("OOM"), "{out}");
    assert!(out.contains("0 of 3 dead letters redriven"), "{out}");
    let mut admin = admin(addr).await;
    let done = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    assert_eq!(done.len(), 1);
    assert!(done[0].skipped.contains("OOM"), "{done:?}");

    let dead: u64 = client.xlen("dl:orders:dead").await.unwrap();
    let origin: u64 = client.xlen("dl:orders").await.unwrap();
    assert_eq!((dead, origin), (3, origin_before), "nothing moved");
    assert!(pending(client, "dl:orders", "billing").await.is_empty());
    let dead: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(dead, [frame]);
    let jobs: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!(jobs, 0);

    config(&["maxmemory", "0"]);
    let (code, out, err) = cli(addr, &["redrive", "stream:dl:orders:dead", "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("3 of 3 dead letters redriven"), "{out}");
    assert_eq!(pending(client, "dl:orders", "billing").await.len(), 3);
    let done = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    assert!(done[0].skipped.is_empty(), "{done:?}");
    let jobs: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!(jobs, 1);
    on.sidecar.stop().await;
}

/// Byte-identical list dead letters (the same value dead-lettered with the same reason) are
/// listed under ids of one digest; each id purges or redrives exactly one of them, by the
/// command and by the service, an id given twice still one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_names_one_of_identical_list_dead_letters() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    let reliable = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "dl:twins".into(),
                consumer: "w1".into(),
                ..Default::default()
            },
        )),
        count: 4,
        block: Some(window_sidecar_harness::duration(Duration::from_millis(200))),
        ..Default::default()
    };
    let target = proto::PublishRequest {
        list: "dl:twins".into(),
        ..Default::default()
    };
    publish_payloads(&addr, target, &["job-7"; 4]).await;
    dead_letter_through(&addr, reliable, list_dead_letter("dl:twins:dead"), 4).await;
    // As in ListDeadLetters: no list subscription left to take a redriven value.
    sidecar.stop().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    let mut admin = admin(&addr).await;
    let listed = admin
        .list_dead_letters(proto::ListDeadLettersRequest {
            target: list("dl:twins:dead"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    let listed = ids(&listed);
    let digest = listed[0].split_once(':').unwrap().1.to_owned();
    assert_eq!(
        listed,
        (0..4).map(|i| format!("{i}:{digest}")).collect::<Vec<_>>(),
        "four identical dead letters"
    );
    let dead = || async {
        let n: u64 = client.llen("dl:twins:dead").await.unwrap();
        n
    };

    // The command purges the one named.
    let (code, out, err) = cli(&addr, &["purge", "list:dl:twins:dead", "--id", &listed[1]]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("purged {}", listed[1])), "{out}");
    assert!(out.contains("1 dead letters purged"), "{out}");
    assert_eq!(dead().await, 3);

    // An id given twice is one dead letter; two ids are two.
    let purged = admin
        .purge_dead_letters(proto::PurgeDeadLettersRequest {
            target: list("dl:twins:dead"),
            selection: Some(proto::DeadLetterSelection {
                ids: vec![listed[0].clone(), listed[0].clone()],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(purged.ids, [listed[0].clone()]);
    assert_eq!(dead().await, 2);

    // The service redrives the one named (the value at place 1 is no longer there: it moved to
    // place 0, and its digest still finds one).
    let done = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: list("dl:twins:dead"),
            selection: Some(proto::DeadLetterSelection {
                ids: vec![listed[3].clone()],
                ..Default::default()
            }),
            per_second: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .redriven;
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].skipped.is_empty(), "{done:?}");
    assert_eq!(dead().await, 1);
    let twins: u64 = client.llen("dl:twins").await.unwrap();
    assert_eq!(twins, 1);

    // The command redrives the one named, the last.
    let (code, out, err) = cli(
        &addr,
        &["redrive", "list:dl:twins:dead", "--id", &listed[0]],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 of 1 dead letters redriven"), "{out}");
    assert_eq!(dead().await, 0);
    let twins: u64 = client.llen("dl:twins").await.unwrap();
    assert_eq!(twins, 2);
    sidecar.stop().await;
}

/// A sidecar whose Redis user may write the origins but not delete dead letters (`-xdel
/// -lrem`): a redrive puts nothing back (a stream entry into its group, a list copy) that it
/// could not follow by removing the dead letter (which would leave both), so each is refused
/// with NOPERM and stays; a purge fails saying where it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_may_not_delete_dead_letters_redrives_and_purges_nothing() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", "dl:orders", "g", "$", "MKSTREAM"],
        )
        .await
        .unwrap();
    for p in ["x", "y"] {
        let entry = append(&client, "dl:orders", p).await;
        let _: String = client
            .xadd(
                "dl:orders:dead",
                false,
                None,
                "*",
                vec![
                    ("_payload", p),
                    ("h:x-window-original-id", entry.as_str()),
                    ("h:x-window-subscription", "dl:orders/g"),
                ],
            )
            .await
            .unwrap();
    }
    let value = frame::encode(&[
        (Bytes::from_static(b"_payload"), Bytes::from_static(b"j")),
        (
            Bytes::from_static(b"h:x-window-subscription"),
            Bytes::from_static(b"dl:jobs"),
        ),
    ]);
    let _: i64 = client.lpush("dl:jobs:dead", value.to_vec()).await.unwrap();
    acl_user(&client, "keeper", "pw", "~* &* +@all -xdel -lrem").await;
    let url = url_with_auth(&redis.url(), Some("keeper"), "pw");
    let sidecar = Sidecar::start(&url, &[]).await;
    let mut admin = admin(&sidecar.addr.to_string()).await;

    let done = redrive_all(&mut admin, stream("dl:orders:dead")).await;
    let done_list = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    for r in done.iter().chain(&done_list) {
        assert!(
            r.skipped.contains("NOPERM") && r.skipped.contains("still a dead letter"),
            "{r:?}"
        );
    }
    assert_eq!((done.len(), done_list.len()), (2, 1));
    let dead: u64 = client.xlen("dl:orders:dead").await.unwrap();
    let origin: u64 = client.xlen("dl:orders").await.unwrap();
    assert_eq!((dead, origin), (2, 2), "no copy beside a dead letter");
    assert!(
        pending(&client, "dl:orders", "g").await.is_empty(),
        "nothing pending again beside a dead letter"
    );
    let dead: u64 = client.llen("dl:jobs:dead").await.unwrap();
    let copies: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!((dead, copies), (1, 0));

    let refused = admin
        .purge_dead_letters(proto::PurgeDeadLettersRequest {
            target: stream("dl:orders:dead"),
            selection: all(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("NOPERM")
            && refused
                .message()
                .contains("0 of the 2 dead letters chosen were purged before it"),
        "{}",
        refused.message()
    );
    let dead: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(dead, 2);
    sidecar.stop().await;
}

/// The ids of the `redrove ID to KEY …` lines of the command's output.
fn redrove_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("redrove "))
        .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
        .collect()
}

/// None of `ids` is still a dead letter on the stream `dead`.
async fn still_dead_none_of(client: &Client, dead: &str, ids: &[String]) {
    let left: Vec<(String, HashMap<String, String>)> =
        client.xrange(dead, "-", "+", None).await.unwrap();
    for id in ids {
        assert!(
            !left.iter().any(|(left, _)| left == id),
            "{id} was printed as redriven but is still a dead letter"
        );
    }
}

/// A redrive prints each dead letter as its batch returns, not when the whole call ends: the
/// command killed (SIGKILL) half-way has printed what it moved, and each line printed is a
/// dead letter that moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_prints_each_dead_letter_as_it_goes() {
    use std::io::BufRead;
    const N: usize = 300;
    let redis = RedisServer::start();
    let client = redis.client().await;
    for i in 0..N {
        let _: String = client
            .xadd(
                "slow:dead",
                false,
                None,
                "*",
                vec![
                    ("_payload", i.to_string()),
                    ("h:x-window-subscription", "slow:orders/g".to_owned()),
                ],
            )
            .await
            .unwrap();
    }
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    drop(connect_client(&addr).await);
    // 100 a second: the whole redrive takes 3 s, its first lines come within a fraction.
    let mut redrive = Command::new(sidecar_bin())
        .args([
            "dead-letters",
            "redrive",
            "stream:slow:dead",
            "--all",
            "--to",
            "slow:orders",
        ])
        .env("WINDOW_SIDECAR_ADDR", &addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = redrive.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            lines.push(line.unwrap());
            if lines.len() == 20 {
                break;
            }
        }
        lines
    });
    let lines = tokio::time::timeout(Duration::from_secs(10), lines)
        .await
        .expect("20 lines within 10 s")
        .unwrap();
    redrive.kill().unwrap();
    let _ = redrive.wait();
    let printed = redrove_lines(&lines.join("\n"));
    assert_eq!(printed.len(), 20, "{lines:?}");
    still_dead_none_of(&client, "slow:dead", &printed).await;
    let left: u64 = client.xlen("slow:dead").await.unwrap();
    assert!(left > 0, "the command was killed before the end");
    sidecar.stop().await;
}

/// What the command line alone decides fails before any call, as a usage error (64) naming
/// the command's flags, not the service's field names; an id that is no dead letter fails
/// (66) naming it and the stream or list, and nothing is changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_names_its_flags_and_the_dead_letters_it_looked_in() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let mut admin = admin(addr).await;
    let first = on.listed(&mut admin).await.dead_letters[0].id.clone();
    let dead_letters = || async {
        let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
        len
    };

    // No selection: a usage error, told before any call (no sidecar needed).
    let nowhere = format!("127.0.0.1:{}", free_port());
    for at in [addr.as_str(), nowhere.as_str()] {
        for action in ["redrive", "purge"] {
            let (code, _, err) = cli(at, &[action, "stream:dl:orders:dead"]);
            assert_eq!(code, 64, "{action}: {err}");
            for named in [
                "--id",
                "--reason",
                "--older-than",
                "--all",
                "stream dl:orders:dead",
            ] {
                assert!(err.contains(named), "{action}: {named}: {err}");
            }
            for proto_name in ["all: true", "older_than", "`ids`"] {
                assert!(!err.contains(proto_name), "{action}: {proto_name}: {err}");
            }
        }
    }

    // An id that is not there: 66, naming the id and the stream; nothing moves, not even the
    // id given with it that is there.
    for action in ["redrive", "purge"] {
        let (code, out, err) = cli(
            addr,
            &[
                action,
                "stream:dl:orders:dead",
                "--id",
                &first,
                "--id",
                "999-0",
            ],
        );
        assert_eq!(code, 66, "{action}: {out}{err}");
        assert!(
            err.contains("--id 999-0: no dead letter 999-0 in stream dl:orders:dead"),
            "{action}: {err}"
        );
        assert!(!err.contains(&first), "{action}: {err}");
        assert_eq!(dead_letters().await, 3, "{action} changed nothing");
    }
    let (code, _, err) = cli(addr, &["show", "stream:dl:orders:dead", "999-0"]);
    assert_eq!(code, 66, "{err}");
    assert!(
        err.contains("no dead letter 999-0 in stream dl:orders:dead"),
        "{err}"
    );
    let (code, _, err) = cli(addr, &["purge", "list:dl:none", "--id", "0:feed"]);
    assert_eq!(code, 66, "{err}");
    assert!(
        err.contains("no dead letter 0:feed in list dl:none"),
        "{err}"
    );

    // A list beyond what one call returns names --limit.
    let (code, _, err) = cli(addr, &["list", "stream:dl:orders:dead", "--limit", "20000"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--limit"), "{err}");

    // The id that is there still goes, alone.
    let (code, out, err) = cli(addr, &["redrive", "stream:dl:orders:dead", "--id", &first]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 of 1 dead letters redriven"), "{out}");
    assert_eq!(dead_letters().await, 2);
    on.sidecar.stop().await;
}

/// A sidecar the command cannot talk to is named with the reason: nothing listens, the host
/// does not resolve, a socket file is missing (69); a URL where host:port belongs (64); TLS
/// against a plaintext sidecar, plaintext against a TLS one, a CA that does not sign its
/// certificate, and no client certificate for one that requires it (76).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_says_why_it_cannot_talk_to_the_sidecar() {
    let redis = RedisServer::start();
    let plain = Sidecar::start(&redis.url(), &[]).await;
    let plain_addr = plain.addr.to_string();
    drop(connect_client(&plain_addr).await);
    let material = TlsMaterial::generate_temp();
    let other = TlsMaterial::generate_temp();
    let file = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (cert, key, ca) = (
        file(&material.server_cert),
        file(&material.server_key),
        file(&material.ca_cert),
    );
    let tls = Sidecar::start(&redis.url(), &["--tls-cert", &cert, "--tls-key", &key]).await;
    let tls_addr = tls.addr.to_string();
    let mutual = Sidecar::start(
        &redis.url(),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &ca,
        ],
    )
    .await;
    let mutual_addr = mutual.addr.to_string();
    let list = ["list", "stream:dl:orders:dead"];
    let with = |extra: &[&str]| -> Vec<String> {
        list.iter().chain(extra).map(|s| (*s).to_owned()).collect()
    };
    let run = |addr: &str, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(addr, &args)
    };

    // The right CA (and the client certificate where required) works.
    assert!(
        eventually(Duration::from_secs(10), || async {
            run(&tls_addr, with(&["--tls-ca", &ca])).0 == 0
        })
        .await
    );
    let (client_cert, client_key) = (file(&material.client_cert), file(&material.client_key));
    let (code, _, err) = run(
        &mutual_addr,
        with(&[
            "--tls-ca",
            &ca,
            "--tls-cert",
            &client_cert,
            "--tls-key",
            &client_key,
        ]),
    );
    assert_eq!(code, 0, "{err}");

    let port = free_port();
    let cases: Vec<(String, Vec<String>, i32, Vec<String>)> = vec![
        (
            format!("127.0.0.1:{port}"),
            with(&[]),
            69,
            vec![
                format!("No sidecar at 127.0.0.1:{port} (connection refused)"),
                "--sidecar".into(),
            ],
        ),
        (
            "no-such-host.invalid:50051".into(),
            with(&[]),
            69,
            vec!["No sidecar at no-such-host.invalid:50051 (its host name does not resolve".into()],
        ),
        (
            "unix:/nonexistent/window-sidecar.sock".into(),
            with(&[]),
            69,
            vec![
                "No sidecar at unix:/nonexistent/window-sidecar.sock (no such socket file)".into(),
            ],
        ),
        (
            format!("http://{plain_addr}"),
            with(&[]),
            64,
            vec![format!(
                "--sidecar (WINDOW_SIDECAR_ADDR) \"http://{plain_addr}\" is a URL: write host:port (\"{plain_addr}\")"
            )],
        ),
        (
            plain_addr.clone(),
            with(&["--tls-ca", &ca]),
            76,
            vec!["does not speak TLS".into(), "--tls-ca".into()],
        ),
        (
            tls_addr.clone(),
            with(&[]),
            76,
            vec!["it likely speaks TLS, so give its CA with --tls-ca".into()],
        ),
        (
            tls_addr.clone(),
            with(&["--tls-ca", &file(&other.ca_cert)]),
            76,
            vec!["presented a certificate that --tls-ca does not accept".into()],
        ),
        (
            mutual_addr.clone(),
            with(&["--tls-ca", &ca]),
            76,
            vec![
                "requires a client certificate (mutual TLS), so give --tls-cert and --tls-key"
                    .into(),
            ],
        ),
    ];
    for (addr, args, want, says) in cases {
        let (code, out, err) = run(&addr, args.clone());
        assert_eq!(code, want, "{addr} {args:?}: {out}{err}");
        for said in &says {
            assert!(
                err.contains(said.as_str()),
                "{addr} {args:?}: {said}: {err}"
            );
        }
        assert!(!err.contains("transport error\n"), "{err}");
    }
    mutual.stop().await;
    tls.stop().await;
    plain.stop().await;
}

/// A list redrive in batches: each batch names its dead letters at their places as they are
/// after the batches before it, and identical values (found by their digest) go once each;
/// every value arrives once and the dead letter is left empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_redrive_in_batches_moves_each_value_once() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let mut values: Vec<String> = (0..25).map(|i| format!("v{i}")).collect();
    values.extend(std::iter::repeat_n("dup".to_owned(), 5));
    for value in &values {
        let _: i64 = client.lpush("batch:dead", value.as_str()).await.unwrap();
    }
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    drop(connect_client(&addr).await);
    // 50 a second: batches of 5.
    let (code, out, err) = cli(
        &addr,
        &[
            "redrive",
            "list:batch:dead",
            "--all",
            "--to",
            "batch:jobs",
            "--rate",
            "50",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("30 of 30 dead letters redriven"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("redrove ")).count(),
        30
    );
    let left: u64 = client.llen("batch:dead").await.unwrap();
    assert_eq!(left, 0, "{out}");
    let mut moved: Vec<String> = client.lrange("batch:jobs", 0, -1).await.unwrap();
    moved.sort();
    values.sort();
    assert_eq!(moved, values);
    sidecar.stop().await;
}

/// `rg:orders` with groups `a` and `b`, both created before its entries, and dead letters on
/// `rg:orders:dead`.
const ORIGIN: &str = "rg:orders";
const DEAD: &str = "rg:orders:dead";

/// Appends `payload` to `key`; returns its id.
async fn append(client: &Client, key: &str, payload: &str) -> String {
    client
        .xadd(key, false, None, "*", vec![("_payload", payload)])
        .await
        .unwrap()
}

/// Writes a dead letter as the sidecar writes one for the entry `entry_id` of `ORIGIN`, given
/// up on by `group` (fields as `Entry::dead_letter_fields` lays them out); returns its id.
async fn dead_letter_of(client: &Client, group: &str, entry_id: &str, payload: &str) -> String {
    let subscription = format!("{ORIGIN}/{group}");
    client
        .xadd(
            DEAD,
            false,
            None,
            "*",
            vec![
                ("_payload", payload),
                ("h:x-window-original-id", entry_id),
                ("h:x-window-subscription", subscription.as_str()),
                ("h:x-window-deliveries", "5"),
                ("h:x-ruststream-retry-count", "5"),
                ("h:x-window-reason", REASON),
            ],
        )
        .await
        .unwrap()
}

/// The pending entries of `group` on `key`: (id, consumer, deliveries).
async fn pending(client: &Client, key: &str, group: &str) -> Vec<(String, String, u64)> {
    let reply: Value = client
        .custom(fred::cmd!("XPENDING"), vec![key, group, "-", "+", "100"])
        .await
        .unwrap();
    let Value::Array(rows) = reply else {
        panic!("XPENDING: {reply:?}")
    };
    rows.into_iter()
        .map(|row| {
            let Value::Array(row) = row else {
                panic!("XPENDING row: {row:?}")
            };
            (
                row[0].as_string().unwrap(),
                row[1].as_string().unwrap(),
                row[3].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The ids a plain consumer `cb` of `group` reads as new (`XREADGROUP … >`), acked at once.
async fn read_new(client: &Client, key: &str, group: &str) -> Vec<String> {
    let reply: Value = client
        .custom(
            fred::cmd!("XREADGROUP"),
            vec!["GROUP", group, "cb", "COUNT", "100", "STREAMS", key, ">"],
        )
        .await
        .unwrap();
    let mut ids = Vec::new();
    if let Value::Array(streams) = reply {
        for stream in streams {
            let Value::Array(mut parts) = stream else {
                panic!("XREADGROUP: {stream:?}")
            };
            let Value::Array(entries) = parts.remove(1) else {
                panic!("XREADGROUP entries")
            };
            for entry in entries {
                let Value::Array(entry) = entry else {
                    panic!("XREADGROUP entry: {entry:?}")
                };
                ids.push(entry[0].as_string().unwrap());
            }
        }
    }
    for id in &ids {
        let _: u64 = client.xack(key, group, id.as_str()).await.unwrap();
    }
    ids
}

/// `ORIGIN` with groups `a` and `b` and `n` entries, each read and acknowledged by group `b`;
/// returns their ids.
async fn two_groups(client: &Client, n: usize) -> Vec<String> {
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", ORIGIN, "a", "$", "MKSTREAM"],
        )
        .await
        .unwrap();
    let _: () = client.xgroup_create(ORIGIN, "b", "$", false).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(append(client, ORIGIN, &format!("p{i}")).await);
    }
    assert_eq!(read_new(client, ORIGIN, "b").await, ids);
    ids
}

/// A stream dead letter redriven back to its origin re-enters only the group it came from:
/// group `a`, which gave up on the entry, gets the same entry id back once, its count
/// restarted, through a live subscription's reclaim; group `b`, which had acknowledged it,
/// reads nothing new and has nothing pending; the stream gets no new entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_redrive_puts_the_entry_back_into_its_own_group_only() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let ids = two_groups(&client, 1).await;
    let entry = &ids[0];
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "200ms"]).await;
    let addr = sidecar.addr.to_string();
    dead_letter_through(
        &addr,
        stream_open(ORIGIN, "a", "c1", 8),
        stream_dead_letter(DEAD),
        1,
    )
    .await;
    let mut admin = admin(&addr).await;
    let listed = admin
        .list_dead_letters(proto::ListDeadLettersRequest {
            target: stream(DEAD),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert_eq!(listed.len(), 1);
    let letter = &listed[0].id;
    assert!(pending(&client, ORIGIN, "a").await.is_empty());
    let origin_len: u64 = client.xlen(ORIGIN).await.unwrap();

    let (code, out, err) = cli(&addr, &["redrive", &format!("stream:{DEAD}"), "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "redrove {letter} back into group a of {ORIGIN} as {entry}"
        )),
        "{out}"
    );
    assert!(out.contains("1 of 1 dead letters redriven"), "{out}");
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    let len: u64 = client.xlen(ORIGIN).await.unwrap();
    assert_eq!((dead, len), (0, origin_len), "no new entry in the stream");
    assert_eq!(
        pending(&client, ORIGIN, "a").await,
        [(entry.clone(), "window:redriven".to_owned(), 0)],
        "pending in its group again, its count reset"
    );
    assert!(pending(&client, ORIGIN, "b").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());

    // Group a's live subscriber reclaims it: the same entry, once, as a first delivery.
    let mut worker = Worker::open(&addr, stream_open(ORIGIN, "a", "c1", 8)).await;
    let read = worker.next_read().await;
    assert_eq!(read.deliveries.len(), 1, "{read:?}");
    let d = &read.deliveries[0];
    assert_eq!(&d.entry_id, entry);
    assert_eq!(d.payload.as_ref(), b"p0");
    assert_eq!(d.delivery_count, 1, "the count restarts");
    worker.ack(&read.deliveries).await;
    worker
        .report_for(read.read_id, Duration::from_secs(5))
        .await
        .expect("the ack is flushed");
    assert!(
        matches!(worker.next(Duration::from_secs(1)).await, Next::Idle),
        "delivered once"
    );
    worker.close();
    assert!(pending(&client, ORIGIN, "a").await.is_empty());
    assert!(pending(&client, ORIGIN, "b").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());
    let len: u64 = client.xlen(ORIGIN).await.unwrap();
    assert_eq!(len, origin_len);
    sidecar.stop().await;
}

/// A stream dead letter that cannot re-enter its group alone stays where it is, each said so
/// per letter: its entry trimmed from the stream (the command names --to), its group gone
/// (NOGROUP, exit 1), or no record of the entry it was. `--to` naming the origin itself then
/// appends a copy, which every group of the stream reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dead_letter_that_cannot_reenter_its_group_stays() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let ids = two_groups(&client, 3).await;
    // Group a read them and gave up on each.
    assert_eq!(read_new(&client, ORIGIN, "a").await, ids);
    let trimmed = dead_letter_of(&client, "a", &ids[0], "p0").await;
    let no_group = dead_letter_of(&client, "gone", &ids[1], "p1").await;
    let no_entry: String = client
        .xadd(
            DEAD,
            false,
            None,
            "*",
            vec![
                ("_payload", "p2"),
                ("h:x-window-subscription", "rg:orders/a"),
            ],
        )
        .await
        .unwrap();
    let _: u64 = client
        .custom(fred::cmd!("XTRIM"), vec![ORIGIN, "MINID", ids[1].as_str()])
        .await
        .unwrap();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    let spec = format!("stream:{DEAD}");

    let (code, out, err) = cli(&addr, &["redrive", &spec, "--all"]);
    assert_eq!(code, 1, "NOGROUP is Redis refusing: {out}{err}");
    let line = |id: &str| {
        out.lines()
            .find(|l| l.contains(&format!(" {id}: ")))
            .unwrap_or_else(|| panic!("{id} is reported: {out}"))
            .to_owned()
    };
    let said = line(&trimmed);
    assert!(
        said.starts_with(&format!("skipped {trimmed}: "))
            && said.contains(&format!(
                "its entry {} is no longer in {ORIGIN} (trimmed by retention, or deleted)",
                ids[0]
            ))
            && said.contains("still a dead letter")
            && said.contains("--to")
            && !said.contains("`to`"),
        "{said}"
    );
    let said = line(&no_group);
    assert!(
        said.starts_with(&format!("refused {no_group}: "))
            && said.contains(&format!(
                "NOGROUP stream {ORIGIN} has no consumer group gone"
            ))
            && said.contains("still a dead letter"),
        "{said}"
    );
    let said = line(&no_entry);
    assert!(
        said.starts_with(&format!("skipped {no_entry}: "))
            && said.contains("x-window-original-id")
            && said.contains("--to"),
        "{said}"
    );
    assert!(out.contains("0 of 3 dead letters redriven"), "{out}");
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    assert_eq!(dead, 3, "every dead letter stays");
    assert!(pending(&client, ORIGIN, "a").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());
    let len: u64 = client.xlen(ORIGIN).await.unwrap();
    assert_eq!(len, 2);

    // --to naming the origin itself is a copy: a new entry, for every group of the stream.
    let (code, out, err) = cli(&addr, &["redrive", &spec, "--id", &trimmed, "--to", ORIGIN]);
    assert_eq!(code, 0, "{out}{err}");
    let copy = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("redrove {trimmed} to {ORIGIN} as ")))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    assert_eq!(
        read_new(&client, ORIGIN, "a").await,
        std::slice::from_ref(&copy)
    );
    assert_eq!(read_new(&client, ORIGIN, "b").await, [copy]);
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    assert_eq!(dead, 2);
    sidecar.stop().await;
}

/// A sidecar whose Redis user may not run XCLAIM redrives no stream dead letter back into its
/// group: Redis refuses it before anything is written (NOPERM), the dead letter stays and the
/// group has nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_into_a_group_redis_refuses_leaves_the_dead_letter() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let ids = two_groups(&client, 1).await;
    assert_eq!(read_new(&client, ORIGIN, "a").await, ids);
    let letter = dead_letter_of(&client, "a", &ids[0], "p0").await;
    acl_user(&client, "reader", "pw", "~* &* +@all -xclaim").await;
    let sidecar = Sidecar::start(&url_with_auth(&redis.url(), Some("reader"), "pw"), &[]).await;
    let addr = sidecar.addr.to_string();

    let (code, out, err) = cli(&addr, &["redrive", &format!("stream:{DEAD}"), "--all"]);
    assert_eq!(code, 1, "{out}{err}");
    let said = out
        .lines()
        .find(|l| l.starts_with(&format!("refused {letter}: ")))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        said.contains(&format!("to {ORIGIN} (group a)"))
            && said.contains("NOPERM")
            && said.contains("still a dead letter"),
        "{said}"
    );
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    assert_eq!(dead, 1);
    assert!(pending(&client, ORIGIN, "a").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());
    sidecar.stop().await;
}
