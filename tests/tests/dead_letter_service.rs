//! The dead-letter service at work, through its gRPC API and the `window-sidecar dead-letters`
//! command: dead letters of every form that has them (and in the shapes ruststream-fred and
//! plain producers leave) listed decoded and shown, redriven back to their origin with their
//! counts reset or where `to` says, and purged; chosen by id (one of several identical list
//! dead letters), by reason or all, and redriven in batches.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use window_sidecar::domain::frame;
use window_sidecar::proto;
use window_sidecar_harness::dead_letters::{
    ListDeadLetters, REASON, StreamDeadLetters, admin, all, cli, dead_letter_through, ids, list,
    list_dead_letter, publish_payloads, stream,
};
use window_sidecar_harness::{RedisServer, Sidecar, Worker, connect_client, stream_open};

fn payloads(letters: &[proto::DeadLetterEntry]) -> Vec<String> {
    letters
        .iter()
        .map(|l| String::from_utf8_lossy(&l.payload).into_owned())
        .collect()
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
