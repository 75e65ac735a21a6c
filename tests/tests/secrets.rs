//! Credentials and tokens never leave the process: a run at the most verbose log level that used
//! a Redis password and a bearer token, through a wrong token, a failed flush and a Redis
//! restart, shows neither in its logs, its spans, its metrics, its admin view or the errors its
//! clients get; a wrong Redis password is refused without being echoed; `--check-config`
//! redacts the password of a URL.

use std::process::Command;
use std::time::Duration;

use fred::prelude::*;
use tonic::metadata::MetadataValue;
use window_sidecar::proto::{self, window_service_client::WindowServiceClient};
use window_sidecar_harness::telemetry::{
    ack_with, answer_reads, open_orders, start_receiver, traced_with,
};
use window_sidecar_harness::{RedisServer, free_port, ok_body, sidecar_bin};

const REDIS_PASSWORD: &str = "rEdis-pw-8c41e7-SECRET";
const WRONG_PASSWORD: &str = "wr0ng-pw-55d0a2-SECRET";
const TOKEN: &str = "t0ken-3f9b21-SECRET";
const WRONG_TOKEN: &str = "wr0ng-t0ken-a7e6c4-SECRET";

/// Everything a run made visible, searched for each secret.
fn assert_no_secret(what: &str, text: &str) {
    for secret in [REDIS_PASSWORD, WRONG_PASSWORD, TOKEN, WRONG_TOKEN] {
        // Percent-encoded or not, the secrets are plain ASCII letters, digits and dashes.
        assert!(
            !text.contains(secret),
            "{what} contains the secret {secret:?}:\n{}",
            text.lines()
                .filter(|l| l.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Sends `Bearer <token>` with every request.
#[derive(Clone)]
struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

type WithToken = WindowServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>,
>;

/// A channel to the sidecar at `listen`, once it accepts connections.
async fn channel_to(listen: &str) -> tonic::transport::Channel {
    loop {
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{listen}"))
            .unwrap()
            .connect()
            .await
        {
            return channel;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn with_token(channel: tonic::transport::Channel, token: &str) -> WithToken {
    let bearer: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
    WindowServiceClient::with_interceptor(channel, Bearer(bearer))
}

fn one_order() -> proto::PublishRequest {
    proto::PublishRequest {
        stream: "orders".into(),
        entries: vec![proto::PublishEntry {
            payload: "{}".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Kills Redis, publishes (refused), restarts it and publishes until the sidecar reconnected;
/// returns what the refused publish was told.
async fn bounce_redis(redis: &mut RedisServer, client: &mut WithToken) -> String {
    redis.kill();
    let down = client.publish(one_order()).await.unwrap_err();
    redis.restart();
    let mut published = false;
    for _ in 0..100 {
        if client.publish(one_order()).await.is_ok() {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published, "the sidecar did not reconnect");
    format!("{down:?}")
}

/// A run that used every credential, at the most verbose log level, with failures that put
/// connection details into errors: a wrong token, a flush failure, Redis restarting. No secret
/// may appear in its logs, traces, metrics, admin view or the errors clients get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_tokens_never_appear_in_logs_traces_metrics_or_errors() {
    let (receiver, otlp) = start_receiver().await;
    let mut redis = RedisServer::start_with_password(REDIS_PASSWORD);
    let dir = secrets_dir("run");
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();

    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let url = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}", redis.port());
    let token_path = token_file.to_str().unwrap();
    let mut sidecar = traced_with(
        &url,
        &listen,
        &otlp,
        &[
            "--auth-token-file",
            token_path,
            "--metrics-listen",
            &metrics,
        ],
        "debug",
    );
    let channel = channel_to(&listen).await;
    let mut client = with_token(channel.clone(), TOKEN);
    let mut intruder = with_token(channel, WRONG_TOKEN);
    let mut statuses = Vec::new();

    let refused = intruder.publish(one_order()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    statuses.push(format!("{refused:?}"));
    for _ in 0..3 {
        client.publish(one_order()).await.unwrap();
    }
    let inspect = redis.client_with_auth(None, REDIS_PASSWORD).await;
    let _: () = inspect
        .set("a-string", "x", None, None, false)
        .await
        .unwrap();

    let (tx, requests) = open_orders(1).await;
    let mut stream = client.subscribe(requests).await.unwrap().into_inner();
    let (_, reports) = answer_reads(&tx, &mut stream, 2, |read, _, reports| {
        let slot = read.deliveries[0].slot;
        // The second read's side effect fails (WRONGTYPE): an error in a report.
        if reports == 0 {
            ack_with(slot, "INCR", vec!["n".into()], None)
        } else {
            ack_with(slot, "LPUSH", vec!["a-string".into(), "v".into()], None)
        }
    })
    .await;
    statuses.extend(reports.iter().map(|report| format!("{report:?}")));

    // Redis goes away and comes back: connection errors are logged and reported.
    statuses.push(bounce_redis(&mut redis, &mut client).await);
    let metrics_body = ok_body(&metrics, "/metrics").await;
    assert!(metrics_body.contains("window_"), "{metrics_body}");
    let admin_body = ok_body(&metrics, "/subscriptions").await;
    drop(tx);
    drop(stream);
    sidecar.terminate();

    let lines = sidecar.lines().join("\n");
    assert!(
        lines.len() > 10_000,
        "a debug run logs a lot: {} bytes",
        lines.len()
    );
    assert_no_secret("the sidecar's output", &lines);
    assert_no_secret("/metrics", &metrics_body);
    assert_no_secret("/subscriptions", &admin_body);
    assert_no_secret("what clients were told", &statuses.join("\n"));
    let spans = format!("{:?}", receiver.spans.lock().unwrap());
    assert!(spans.contains("window.flush"), "spans were exported");
    assert_no_secret("the exported spans", &spans);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory of this test process for the files that hold secrets.
fn secrets_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "window-sidecar-secrets-{}-{test}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A sidecar given the wrong Redis password, at the most verbose log level: its refusal must
/// not echo what it was given, in its output or its spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_redis_password_is_refused_without_being_echoed() {
    let (receiver, otlp) = start_receiver().await;
    let redis = RedisServer::start_with_password(REDIS_PASSWORD);
    let dir = secrets_dir("wrong-password");
    let wrong_password_file = dir.join("wrong-password");
    std::fs::write(&wrong_password_file, WRONG_PASSWORD).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut wrong = traced_with(
        &format!("redis://127.0.0.1:{}", redis.port()),
        &listen,
        &otlp,
        &[
            "--redis-password-file",
            wrong_password_file.to_str().unwrap(),
        ],
        "debug",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !wrong.lines().iter().any(|l| {
        l.contains("WRONGPASS")
            || l.contains("invalid username-password")
            || l.contains("NOT_SERVING")
            || l.contains("does not answer")
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "the wrong password was never refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wrong.terminate();
    assert_no_secret("the second sidecar's output", &wrong.lines().join("\n"));
    assert_no_secret(
        "the exported spans",
        &format!("{:?}", receiver.spans.lock().unwrap()),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The configuration check echoes URLs in its errors: redacted.
#[test]
fn the_configuration_check_redacts_the_password_of_a_url() {
    let check = Command::new(sidecar_bin())
        .args([
            "--check-config",
            "--redis-url",
            &format!("http://user:{REDIS_PASSWORD}@host"),
        ])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(64));
    assert_no_secret(
        "--check-config's output",
        &String::from_utf8_lossy(&check.stderr),
    );
    assert_no_secret(
        "--check-config's output",
        &String::from_utf8_lossy(&check.stdout),
    );
}
