//! The series the chart's alert rules read count what happened: dead letters, refused consumer
//! names, Redis readiness, the start time and the oldest pending entry's age; and the metric
//! names: every family is `window_sidecar_…`, the former `window_…` names stay for a release.

use std::net::SocketAddr;
use std::time::Duration;

use fred::prelude::StreamsInterface;
use window_sidecar::proto::{self, OutcomeKind::Retry};
use window_sidecar_harness::*;

fn metrics_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}

/// The exposition, once the metrics listener is up (an in-process sidecar binds it after
/// `Sidecar::start` returns).
async fn scrape_up(metrics: SocketAddr) -> String {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        match try_http_get(metrics, "/metrics").await {
            Ok((200, body)) => return body,
            other if tokio::time::Instant::now() >= deadline => panic!("scrape: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn sample_within(metrics: SocketAddr, series: &str, expected: f64) -> f64 {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let now = sample(&scrape_up(metrics).await, series);
        if now == expected || tokio::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn dead_letters_and_refused_consumer_names_are_counted() {
    let redis = RedisServer::start();
    let metrics = metrics_addr();
    let m = metrics.to_string();
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &m]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let open = proto::Open {
        max_deliveries: 2,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..stream_open("orders", "g", "c", 1)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let text = scrape_up(metrics).await;
    assert_eq!(
        sample(&text, "window_sidecar_consumer_refusals_total"),
        0.0,
        "a series from the start"
    );
    // The same consumer name again, on this sidecar: refused.
    let refused = Subscription::open(&mut client, stream_open("orders", "g", "c", 1)).await;
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(tonic::Code::AlreadyExists)
    );
    loop {
        let d = sub.read().await.deliveries.remove(0);
        sub.send(vec![], vec![outcome(d.slot, Retry)]).await;
        if sub.flush().await.dead_lettered == 1 {
            break;
        }
    }
    let text = scrape_up(metrics).await;
    assert_eq!(
        sample(&text, "window_sidecar_consumer_refusals_total"),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "window_sidecar_dead_letters_total{form=\"stream\"}"),
        1.0,
        "{text}"
    );
    sub.close();
    sidecar.stop().await;
}

#[tokio::test]
async fn redis_readiness_and_the_start_time_are_series() {
    let mut redis = RedisServer::start();
    let metrics = metrics_addr();
    let m = metrics.to_string();
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &m]).await;
    assert_eq!(
        sample_within(metrics, "window_sidecar_redis_ready", 1.0).await,
        1.0
    );
    let started = sample(
        &scrape_up(metrics).await,
        "window_sidecar_start_time_seconds",
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    assert!((now - 60.0..=now).contains(&started), "{started} vs {now}");
    redis.kill();
    assert_eq!(
        sample_within(metrics, "window_sidecar_redis_ready", 0.0).await,
        0.0,
        "Redis gone: not ready"
    );
    redis.restart();
    assert_eq!(
        sample_within(metrics, "window_sidecar_redis_ready", 1.0).await,
        1.0,
        "Redis back"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn the_oldest_pending_entry_has_an_age_and_idle_ones_are_work() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    // An entry added a minute and a half ago (its id is its time) and delivered, not acked.
    let then = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 90_000;
    let _: String = inspect
        .xadd("orders", false, None, format!("{then}-0"), ("n", "0"))
        .await
        .unwrap();
    let _: () = inspect
        .xgroup_create("orders", "g", "0", false)
        .await
        .unwrap();
    let _: fred::types::Value = inspect
        .xreadgroup("g", "gone", None, None, false, "orders", ">")
        .await
        .unwrap();
    let metrics = metrics_addr();
    let m = metrics.to_string();
    // min_idle 0 s: the pending entry counts as reclaimable work.
    let sidecar = Sidecar::start(
        &redis.url(),
        &[
            "--metrics-listen",
            &m,
            "--keep",
            "stream:orders:g",
            "--keep-min-idle",
            "0s",
            "--sample-interval",
            "100ms",
        ],
    )
    .await;
    let work = "window_sidecar_work_waiting_entries{form=\"stream\",key=\"orders\",group=\"g\"}";
    assert_eq!(sample_within(metrics, work, 1.0).await, 1.0);
    let age = sample(
        &scrape_up(metrics).await,
        "window_sidecar_oldest_pending_age_seconds{key=\"orders\",group=\"g\"}",
    );
    assert!((89.0..=120.0).contains(&age), "{age}");
    sidecar.stop().await;
}

#[tokio::test]
async fn families_are_window_sidecar_and_the_former_names_are_gone() {
    let redis = RedisServer::start();
    let metrics = metrics_addr();
    let m = metrics.to_string();
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &m]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;
    let text = scrape_up(metrics).await;
    assert_eq!(sample(&text, "window_sidecar_published_entries_total"), 3.0);
    assert!(text.ends_with("# EOF\n"));
    assert_eq!(text.matches("# EOF").count(), 1);
    // 0.1.0 exported its families under window_… too; 0.2.0 dropped those names.
    for line in text.lines() {
        let name = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .or_else(|| line.strip_prefix("# UNIT "))
            .unwrap_or(line);
        assert!(
            line == "# EOF" || name.starts_with("window_sidecar_"),
            "a series outside window_sidecar_: {line}"
        );
    }
    sidecar.stop().await;
}

/// A group created at an id of its own: Redis cannot tell its lag, so the work waiting counts
/// the entries after the group's last delivered id itself, and says so.
#[tokio::test]
async fn an_unknown_lag_is_counted_and_flagged() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    for n in 1..=6 {
        let _: String = inspect
            .xadd("jobs", false, None, format!("{n}-0"), ("n", n.to_string()))
            .await
            .unwrap();
    }
    let _: () = inspect
        .xgroup_create("jobs", "g", "2-0", false)
        .await
        .unwrap();
    let metrics = metrics_addr();
    let m = metrics.to_string();
    let sidecar = Sidecar::start(
        &redis.url(),
        &[
            "--metrics-listen",
            &m,
            "--keep",
            "stream:jobs:g",
            "--sample-interval",
            "100ms",
        ],
    )
    .await;
    let work = "window_sidecar_work_waiting_entries{form=\"stream\",key=\"jobs\",group=\"g\"}";
    assert_eq!(sample_within(metrics, work, 4.0).await, 4.0, "3-0 to 6-0");
    let text = scrape_up(metrics).await;
    assert_eq!(
        sample(
            &text,
            "window_sidecar_work_lag_counted{key=\"jobs\",group=\"g\"}"
        ),
        1.0,
        "{text}"
    );
    // Redis reports no lag either: the group's lag gauge is absent.
    assert!(
        !text.contains("window_sidecar_group_lag_entries{key=\"jobs\""),
        "{text}"
    );
    sidecar.stop().await;
}
