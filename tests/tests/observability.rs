//! What operators see: Prometheus metrics that match what happened, the admin view, gRPC
//! health that follows Redis, reflection through the real grpcurl, and a dashboard whose
//! queries only use metrics the sidecar exports.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use fred::prelude::{KeysInterface, ListInterface, StreamsInterface};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use window_sidecar::proto::{
    self,
    OutcomeKind::{Ack, Drop},
};
use window_sidecar_harness::*;

fn metrics_flags(addr: &str) -> Vec<&str> {
    vec!["--metrics-listen", addr]
}

/// Runs the mixed window (20 entries, every third dropped) on a fresh sidecar; returns it with
/// its metrics address.
async fn mixed_window(redis: &RedisServer) -> (Sidecar, SocketAddr) {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let addr = metrics.to_string();
    let sidecar = Sidecar::start(&redis.url(), &metrics_flags(&addr)).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(20)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 20))
        .await
        .unwrap();
    let read = sub.read().await;
    let mut commands = Vec::new();
    let mut outcomes = Vec::new();
    for d in &read.deliveries {
        let n: u32 = field(d, "n").parse().unwrap();
        commands.push(command(d.slot, "INCR", &["k"]));
        outcomes.push(outcome(
            d.slot,
            if n.is_multiple_of(3) { Drop } else { Ack },
        ));
    }
    sub.send(commands, outcomes).await;
    assert!(sub.flush().await.ok);
    sub.close();
    assert!(matches!(sub.next().await, Ok(None)));
    (sidecar, metrics)
}

#[tokio::test]
async fn metrics_count_what_happened() {
    let redis = RedisServer::start();
    let (sidecar, metrics) = mixed_window(&redis).await;
    let (status, text) = http_get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    let s = |series: &str| sample(&text, series);
    assert_eq!(
        s("window_sidecar_deliveries_total{form=\"stream\"}"),
        20.0,
        "{text}"
    );
    assert_eq!(s("window_sidecar_reads_total{form=\"stream\"}"), 1.0);
    assert_eq!(
        s("window_sidecar_outcomes_total{form=\"stream\",outcome=\"ack\"}"),
        13.0
    );
    assert_eq!(
        s("window_sidecar_outcomes_total{form=\"stream\",outcome=\"drop\"}"),
        7.0
    );
    assert_eq!(
        s("window_sidecar_outcomes_total{form=\"stream\",outcome=\"dead_letter\"}"),
        0.0
    );
    assert_eq!(
        s("window_sidecar_flushes_total{form=\"stream\",mode=\"pipeline\",result=\"ok\"}"),
        1.0
    );
    assert_eq!(
        s("window_sidecar_flush_commands_sum{form=\"stream\"}"),
        13.0
    );
    assert_eq!(s("window_sidecar_flush_settles_sum{form=\"stream\"}"), 20.0);
    assert_eq!(
        s("window_sidecar_flush_duration_seconds_count{form=\"stream\",mode=\"pipeline\"}"),
        1.0
    );
    assert_eq!(
        s("window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"flush\"}"),
        1.0
    );
    assert_eq!(s("window_sidecar_published_entries_total"), 20.0);
    assert_eq!(
        s("window_sidecar_subscriptions_open{form=\"stream\"}"),
        0.0,
        "the subscription closed"
    );
    // The first read of a subscription goes through its own pending entries first (empty here),
    // then reads new ones: flush round trips per read stay at exactly one.
    let flush_trips = s("window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"flush\"}");
    assert_eq!(
        flush_trips / s("window_sidecar_reads_total{form=\"stream\"}"),
        1.0
    );

    let (status, body) = http_get(metrics, "/livez").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let ready = eventually(STEP, || async {
        http_get(metrics, "/readyz").await.0 == 200
    })
    .await;
    assert!(ready, "ready once Redis answers");
    sidecar.stop().await;
}

#[tokio::test]
async fn the_admin_view_lists_open_subscriptions_with_their_window() {
    let redis = RedisServer::start();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let sidecar = Sidecar::start(&redis.url(), &metrics_flags(&metrics.to_string())).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;
    let (mut sub, opened) = Subscription::open(&mut client, stream_open("orders", "g", "c", 3))
        .await
        .unwrap();
    let read = sub.read().await;
    sub.send(vec![], vec![outcome(read.deliveries[0].slot, Ack)])
        .await;

    let view = loop {
        let (status, body) = http_get(metrics, "/subscriptions").await;
        assert_eq!(status, 200);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let view = json["subscriptions"][0].clone();
        if view["kept_segments"] == 1 {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(view["id"], opened.subscription_id);
    assert_eq!(view["form"], "stream");
    assert_eq!(view["key"], "orders");
    assert_eq!(view["group"], "g");
    assert_eq!(view["consumer"], "c");
    assert_eq!(view["mode"], "pipeline");
    assert_eq!(view["outstanding_deliveries"], 2);
    assert_eq!(view["open_reads"], 1);
    assert_eq!(view["counters"]["deliveries"], 3);
    assert_eq!(view["counters"]["outcomes"]["ack"], 1);

    sub.close();
    let _ = sub.flush().await;
    assert!(
        eventually(STEP, || async {
            let (_, body) = http_get(metrics, "/subscriptions").await;
            body.contains("\"subscriptions\":[]")
        })
        .await
    );
    sidecar.stop().await;
}

async fn health(addr: SocketAddr, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap();
    ServingStatus::try_from(response.into_inner().status).unwrap()
}

#[tokio::test]
async fn health_follows_redis_and_liveness_does_not() {
    const SERVICE: &str = "window_sidecar.v1.WindowService";
    let mut redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let serving = |want| {
        let addr = sidecar.addr;
        move || async move { health(addr, SERVICE).await == want }
    };
    assert!(eventually(STEP, serving(ServingStatus::Serving)).await);

    redis.kill();
    assert!(
        eventually(STEP, serving(ServingStatus::NotServing)).await,
        "NOT_SERVING while Redis is down"
    );
    assert_eq!(
        health(sidecar.addr, "").await,
        ServingStatus::Serving,
        "the process itself is alive: liveness must not fail"
    );
    redis.restart();
    assert!(
        eventually(STEP, serving(ServingStatus::Serving)).await,
        "SERVING again once Redis is back"
    );

    // Draining: NOT_SERVING for both.
    sidecar.begin_shutdown();
    let addr = sidecar.addr;
    let draining = eventually(STEP, || async move {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
        match endpoint.connect().await.map(HealthClient::new) {
            Ok(mut client) => client
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .map(|r| r.into_inner().status == ServingStatus::NotServing as i32)
                .unwrap_or(true),
            Err(_) => true,
        }
    })
    .await;
    assert!(draining);
    sidecar.stop().await;
}

#[tokio::test]
async fn grpcurl_lists_the_services_and_gets_serving() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    let sidecar_addr = sidecar.addr;
    assert!(
        eventually(STEP, || async move {
            health(sidecar_addr, "window_sidecar.v1.WindowService").await == ServingStatus::Serving
        })
        .await
    );
    let run = |args: Vec<String>| grpcurl(&args);
    let addr2 = addr.clone();
    let listed =
        tokio::task::spawn_blocking(move || run(vec!["-plaintext".into(), addr2, "list".into()]))
            .await
            .unwrap();
    let services: BTreeSet<&str> = listed.lines().collect();
    for expected in ["window_sidecar.v1.WindowService", "grpc.health.v1.Health"] {
        assert!(
            services.contains(expected),
            "{expected} missing from {listed}"
        );
    }
    let described = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            run(vec![
                "-plaintext".into(),
                addr,
                "describe".into(),
                "window_sidecar.v1.WindowService".into(),
            ])
        }
    })
    .await
    .unwrap();
    assert!(described.contains("rpc Subscribe"), "{described}");
    let checked = tokio::task::spawn_blocking(move || {
        run(vec![
            "-plaintext".into(),
            "-d".into(),
            r#"{"service":"window_sidecar.v1.WindowService"}"#.into(),
            addr,
            "grpc.health.v1.Health/Check".into(),
        ])
    })
    .await
    .unwrap();
    assert!(checked.contains("\"SERVING\""), "{checked}");
    sidecar.stop().await;
}

/// Metric names a PromQL expression uses (`window_…`), without the histogram suffixes.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(found) = expr[i..].find("window_") {
        let start = i + found;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| start + n);
        if boundary {
            let name = &expr[start..end];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            names.insert(base.to_owned());
        }
        i = end;
    }
    names
}

#[tokio::test]
async fn the_dashboard_queries_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../helm/window-sidecar/dashboards/window-sidecar.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap())
            .expect("the dashboard is JSON");
    let mut used = BTreeSet::new();
    let mut stack = vec![&dashboard];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(expr)) = map.get("expr") {
                    used.extend(metric_names(expr));
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    assert!(
        used.len() >= 8,
        "the dashboard should chart the sidecar's metrics: {used:?}"
    );

    let redis = RedisServer::start();
    let (sidecar, metrics) = mixed_window(&redis).await;
    // Keep a subscription open so per-subscription series exist, and let the sampler run.
    let mut client = sidecar.client().await;
    let (_sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "sampled", 1))
        .await
        .unwrap();
    let sampled = eventually(STEP, || async {
        let (_, text) = http_get(metrics, "/metrics").await;
        text.contains("window_sidecar_group_lag_entries{")
            && text.contains("window_sidecar_delay_set_entries{")
    })
    .await;
    assert!(sampled, "group pending/lag and delay-set depth are sampled");
    let (_, text) = http_get(metrics, "/metrics").await;
    let exported: BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    // Counters are typed under their name without `_total`.
    let exported_names = |name: &str| {
        exported.contains(name)
            || name
                .strip_suffix("_total")
                .is_some_and(|n| exported.contains(n))
    };
    let missing: Vec<_> = used.iter().filter(|name| !exported_names(name)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the sidecar does not export: {missing:?}\n{text}"
    );
    sidecar.stop().await;
}

/// A sidecar sampling every 100 ms, left with backlogs nobody consumes: a group whose only
/// subscription closed with two entries pending and five more published since, a group and a
/// list named by `--watch` that nobody ever opened, and a reliable list whose consumer left one
/// of three values on its processing list.
struct Unconsumed {
    _redis: RedisServer,
    inspect: fred::clients::Client,
    metrics: SocketAddr,
    sidecar: Sidecar,
}

/// The backlog gauges `Unconsumed` leaves, and their values.
const UNCONSUMED: [(&str, f64); 7] = [
    (
        "window_sidecar_group_pending_entries{key=\"orders\",group=\"g\"}",
        2.0,
    ),
    (
        "window_sidecar_group_lag_entries{key=\"orders\",group=\"g\"}",
        5.0,
    ),
    (
        "window_sidecar_group_pending_entries{key=\"billing:eu\",group=\"payments\"}",
        0.0,
    ),
    (
        "window_sidecar_group_lag_entries{key=\"billing:eu\",group=\"payments\"}",
        3.0,
    ),
    ("window_sidecar_list_entries{key=\"idle-jobs\"}", 4.0),
    ("window_sidecar_list_entries{key=\"jobs\"}", 2.0),
    ("window_sidecar_list_processing_entries{key=\"jobs\"}", 1.0),
];

impl Unconsumed {
    async fn start() -> Unconsumed {
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let addr = metrics.to_string();
        let sidecar = Sidecar::start(
            &redis.url(),
            &[
                "--metrics-listen",
                &addr,
                "--sample-interval",
                "100ms",
                "--watch",
                "stream:billing:eu:payments",
                "--watch",
                "list:idle-jobs",
            ],
        )
        .await;
        let mut client = sidecar.client().await;
        let _: () = inspect
            .xgroup_create("billing:eu", "payments", "0", true)
            .await
            .unwrap();
        publish(&mut client, "billing:eu", numbered(3)).await;
        let _: i64 = inspect
            .lpush("idle-jobs", vec!["a", "b", "c", "d"])
            .await
            .unwrap();

        // A worker reads two entries and crashes without an outcome.
        publish(&mut client, "orders", numbered(2)).await;
        let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 2))
            .await
            .unwrap();
        assert_eq!(sub.read().await.deliveries.len(), 2);
        sub.close();
        assert!(matches!(sub.next().await, Ok(None)));
        // And one of a reliable list, with one of three values.
        let _: i64 = inspect.lpush("jobs", vec!["1", "2", "3"]).await.unwrap();
        let open = proto::Open {
            source: Some(proto::open::Source::ReliableList(
                proto::ReliableListSource {
                    key: "jobs".into(),
                    consumer: "c".into(),
                    ..Default::default()
                },
            )),
            max_in_flight: 1,
            ..stream_open("-", "-", "-", 1)
        };
        let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
        assert_eq!(sub.read().await.deliveries.len(), 1);
        sub.close();
        assert!(matches!(sub.next().await, Ok(None)));
        // Producers go on once nobody consumes: the stream subscription's last blocking read
        // has returned (it frees the consumer's lease then; a read still blocked in Redis would
        // take what is published now).
        let ended = eventually(STEP, || async {
            let held: i64 = inspect.exists("{orders}:window:lease:g:c").await.unwrap();
            held == 0
        })
        .await;
        assert!(ended, "the stream subscription ended");
        publish(&mut client, "orders", numbered(5)).await;
        Unconsumed {
            _redis: redis,
            inspect,
            metrics,
            sidecar,
        }
    }

    /// Waits for every gauge of `UNCONSUMED` to show its value.
    async fn assert_backlog_shown(&self) {
        let metrics = self.metrics;
        let holds = |text: &str| {
            UNCONSUMED
                .iter()
                .all(|(series, value)| text.contains(series) && sample(text, series) == *value)
        };
        let settled = eventually(STEP, || async {
            holds(&http_get(metrics, "/metrics").await.1)
        })
        .await;
        let text = http_get(metrics, "/metrics").await.1;
        assert!(settled, "expected {UNCONSUMED:?} in\n{text}");
    }
}

/// The backlog stays visible when nobody consumes: a group whose only subscription closed with
/// entries pending, a group and a list named by `--watch` that nobody ever opened, and a
/// reliable list whose consumer left entries on its processing list.
#[tokio::test]
async fn backlog_gauges_stay_while_no_subscription_is_open() {
    let on = Unconsumed::start().await;
    on.assert_backlog_shown().await;
    on.sidecar.stop().await;
}

/// A group deleted under the gauges loses its series rather than reporting a stale backlog.
#[tokio::test]
async fn a_deleted_groups_backlog_gauges_go_away() {
    let on = Unconsumed::start().await;
    on.assert_backlog_shown().await;
    let metrics = on.metrics;
    let _: i64 = on.inspect.xgroup_destroy("orders", "g").await.unwrap();
    let gone = eventually(STEP, || async {
        !http_get(metrics, "/metrics")
            .await
            .1
            .contains("window_sidecar_group_pending_entries{key=\"orders\"")
    })
    .await;
    assert!(gone, "the deleted group's series went away");
    on.sidecar.stop().await;
}
