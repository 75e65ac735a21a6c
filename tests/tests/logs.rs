//! The log lines an operator reads to know what the sidecar did: at start, which server it
//! reached and whether that server has `XACKDEL` (said once); at a subscription's close, what
//! the close flushed and what it left pending.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind;
use window_sidecar_harness::telemetry::{json_lines, traced_env};
use window_sidecar_harness::{RedisServer, connect_client, free_port};

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
