//! Entries given back when their subscription closes while Redis refuses the give-back. A
//! simple list's left Redis when they were popped: the sidecar holds them and pushes them back
//! once Redis takes them, and says so in its log (held, taken back, or lost when it stops
//! first). A reliable list's stay on the consumer's processing list, for its next subscription.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar_harness::refusals::{
    Fault, Form, admin, deliveries, open_once_the_lease_expires,
};
use window_sidecar_harness::*;

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
