//! The log lines an operator reads to know what the sidecar did: at start, which server it
//! reached and whether that server has `XACKDEL` (said once); at a subscription's close, what
//! the close flushed and what it left pending; and the entries Redis decided about (settled
//! without a side effect it refused, a due retry another consumer claimed).

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::refusals::admin;
use window_sidecar_harness::telemetry::{json_lines, traced_env};
use window_sidecar_harness::{
    RedisServer, Subscription, command, connect_client, free_port, outcome, publish, retry_after,
    stream_open,
};

/// The closing log line says what the close flushed and what it left pending, as
/// `docs/reference/runtime.md` (Shutdown) promises: a read with one delivery acked and one
/// still out when SIGTERM's grace runs out is flushed at the close (the ack), and the other
/// stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closing_log_line_says_what_was_flushed_and_left_pending() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(
        &redis.url(),
        &listen,
        &[],
        &["--shutdown-grace", "300ms"],
        "info",
    );
    let mut client = connect_client(&listen).await;
    window_sidecar_harness::publish(&mut client, "closing", window_sidecar_harness::numbered(2))
        .await;
    let (mut sub, _) = window_sidecar_harness::Subscription::open(
        &mut client,
        window_sidecar_harness::stream_open("closing", "g", "c", 2),
    )
    .await
    .unwrap();
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 2);
    sub.send(
        vec![],
        vec![window_sidecar_harness::outcome(
            read.deliveries[0].slot,
            OutcomeKind::Ack,
        )],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    sidecar.terminate();

    let closed: Vec<_> = json_lines(&sidecar)
        .into_iter()
        .filter(|l| l["message"] == "subscription closed")
        .collect();
    assert_eq!(closed.len(), 1, "{closed:#?}");
    let line = &closed[0];
    assert_eq!(line["flushed_at_close"], 1, "{line}");
    assert_eq!(line["left_pending"], 1, "{line}");
    for field in [
        "reads",
        "deliveries",
        "flushes",
        "failed_flushes",
        "outcomes",
    ] {
        assert!(!line[field].is_null(), "no {field} in {line}");
    }
    let pending = window_sidecar_harness::pending(&redis.client().await, "closing", "g").await;
    assert_eq!(pending, 1, "the delivery without an outcome stays pending");
}

/// The sidecar says once, at start, which server it reached and whether it has `XACKDEL`: the
/// line an operator compares with the README's table of supported servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_and_what_it_offers_are_logged_once_at_start() {
    let redis = RedisServer::start();
    let info: String = redis
        .client()
        .await
        .info(Some(fred::types::InfoKind::Server))
        .await
        .unwrap();
    let product = window_sidecar_harness::info_field(&info, "server_name").unwrap_or("redis");
    let version = window_sidecar_harness::info_field(&info, &format!("{product}_version"))
        .unwrap()
        .to_owned();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(&redis.url(), &listen, &[], &[], "info");
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("\"redis server\"")).unwrap();
    assert_eq!(line["product"], product, "{line}");
    assert_eq!(line["version"], version.as_str(), "{line}");
    // Redis 8.2 and Valkey 9.2 have XACKDEL; the releases before them do not.
    let major_minor: Vec<u32> = version
        .split('.')
        .take(2)
        .map(|n| n.parse().unwrap())
        .collect();
    let has = match product {
        "valkey" => major_minor >= vec![9, 2],
        _ => major_minor >= vec![8, 2],
    };
    assert_eq!(line["xackdel"], has, "{line}");
    sidecar.terminate();
    let again = sidecar
        .logged_lines()
        .iter()
        .filter(|l| l.contains("\"redis server\""))
        .count();
    assert_eq!(again, 0, "logged once");
}

/// Pipeline mode: a side effect Redis refuses leaves its entry's settle standing, and the flush
/// report says so. A client that leaves right after sending its outcomes never reads that
/// report: the `flush failed` line names the entries all the same (`docs/reference/runtime.md`,
/// Logs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flush_names_the_entries_settled_without_their_side_effects() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(&redis.url(), &listen, &[], &[], "info");
    let inspect = redis.client().await;
    let _: () = inspect
        .set("effects", "a string", None, None, false)
        .await
        .unwrap();
    let mut client = connect_client(&listen).await;
    let ids = publish(&mut client, "left", vec![vec![("n", "0".to_owned())]]).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("left", "g", "c", 1))
        .await
        .unwrap();
    let read = sub.read().await;
    let slot = read.deliveries[0].slot;
    // Redis holds the flush until the client is gone; then refuses its HINCRBY (WRONGTYPE).
    admin(redis.port(), &["CLIENT", "PAUSE", "1000", "WRITE"]);
    sub.send(
        vec![command(slot, "HINCRBY", &["effects", "f", "1"])],
        vec![outcome(slot, OutcomeKind::Ack)],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop((sub, client));
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("\"flush failed\"")).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["effects_refused"], ids[0].as_str(), "{line}");
    assert_eq!(line["read_id"], read.read_id, "{line}");
    assert_eq!(line["failed"], 1, "{line}");
    assert_eq!(line["settle_failed"], false, "{line}");
    assert!(
        line["error"].as_str().unwrap().starts_with("WRONGTYPE"),
        "{line}"
    );
    assert_eq!(line["span"]["consumer"], "c", "{line}");
    let pending = window_sidecar_harness::pending(&inspect, "left", "g").await;
    assert_eq!(pending, 0, "the settle stood");
    sidecar.terminate();
}

/// A `retry_after` kept in place that another consumer claims before it falls due is theirs:
/// the count look-up at its due time finds it gone, the sidecar logs it, and the key's next
/// entry goes out here (`docs/design.md`, Ordering keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_retry_another_consumer_claimed_is_logged_and_its_key_moves_on() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = traced_env(&redis.url(), &listen, &[], &[], "info");
    let inspect = redis.client().await;
    let mut client = connect_client(&listen).await;
    let keyed = |n: &str| vec![("k", "a".to_owned()), ("n", n.to_owned())];
    let ids = publish(&mut client, "claimed", vec![keyed("0"), keyed("1")]).await;
    let mut open = stream_open("claimed", "g", "c", 2);
    open.ordering_key = Some(proto::OrderingKey {
        source: Some(proto::ordering_key::Source::Field("k".into())),
    });
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = sub.read().await;
    let first: Vec<&str> = read
        .deliveries
        .iter()
        .map(|d| d.entry_id.as_str())
        .collect();
    assert_eq!(first, [ids[0].as_str()], "one entry of the key at a time");
    sub.send(
        vec![],
        vec![retry_after(
            read.deliveries[0].slot,
            Duration::from_millis(1500),
        )],
    )
    .await;
    assert!(sub.flush().await.ok);
    admin(
        redis.port(),
        &["XCLAIM", "claimed", "g", "thief", "0", &ids[0], "JUSTID"],
    );
    let next = tokio::time::timeout(Duration::from_secs(10), sub.read())
        .await
        .expect("the key's next entry goes out");
    let got: Vec<&str> = next
        .deliveries
        .iter()
        .map(|d| d.entry_id.as_str())
        .collect();
    assert_eq!(got, [ids[1].as_str()], "the claimed one is the thief's");
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("due retries claimed by another consumer")).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["entries"], ids[0].as_str(), "{line}");
    assert_eq!(line["count"], 1, "{line}");
    assert_eq!(line["span"]["consumer"], "c", "{line}");
    let owner: Vec<(String, String, u64, u64)> = inspect
        .xpending("claimed", "g", (ids[0].as_str(), ids[0].as_str(), 1))
        .await
        .unwrap();
    assert_eq!(owner[0].1, "thief", "{owner:?}");
    drop((sub, client));
    sidecar.terminate();
}
