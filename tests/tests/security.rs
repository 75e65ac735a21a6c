//! Who may talk to the sidecar: bearer tokens on every call (health stays open for probes),
//! a Unix domain socket listener, mutual TLS and who may read the admin view; and what clients
//! are told when Redis refuses the sidecar's own credentials.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::*;

fn publish_request() -> proto::PublishRequest {
    proto::PublishRequest {
        stream: "orders".into(),
        entries: vec![proto::PublishEntry {
            payload: "{}".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn every_call_needs_the_bearer_token_but_health_stays_open() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("window-sidecar-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let sidecar = Sidecar::start(
        &redis.url(),
        &["--auth-token-file", token_file.to_str().unwrap()],
    )
    .await;
    let mut client = sidecar.client().await;

    let status = client.publish(publish_request()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(
        status.message().contains("authorization: Bearer"),
        "{}",
        status.message()
    );

    let mut wrong = tonic::Request::new(publish_request());
    wrong
        .metadata_mut()
        .insert("authorization", MetadataValue::from_static("Bearer nope"));
    let status = client.publish(wrong).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(
        !status.message().contains("s3cret"),
        "the token never appears in errors"
    );

    let mut right = tonic::Request::new(publish_request());
    right.metadata_mut().insert(
        "authorization",
        MetadataValue::from_static("Bearer s3cret-token"),
    );
    assert_eq!(
        client.publish(right).await.unwrap().into_inner().ids.len(),
        1
    );

    // Subscriptions too.
    let status = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .err()
        .expect("refused without a token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);

    let channel = Endpoint::from_shared(format!("http://{}", sidecar.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "probes need no token: {health:?}");
    sidecar.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_sidecar_listens_on_a_unix_socket_and_stock_clients_reach_it() {
    let redis = RedisServer::start();
    let path = std::env::temp_dir().join(format!("window-sidecar-{}.sock", free_port()));
    let path_str = format!("unix:{}", path.display());
    let config = <window_sidecar::config::Config as clap::Parser>::try_parse_from([
        "window-sidecar",
        "--redis-url",
        &redis.url(),
        "--listen",
        &path_str,
    ])
    .unwrap();
    let listener = window_sidecar::server::Listener::bind(&config.listen)
        .await
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "only the owner and its group may connect");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(window_sidecar::server::run(
        config,
        listener,
        shutdown.clone(),
        false,
    ));

    let channel = window_sidecar::grpc::connect_unix(&path).await.unwrap();
    let mut client = WindowServiceClient::new(channel);
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send(vec![], vec![outcome(d.slot, OutcomeKind::Ack)])
        .await;
    assert!(sub.flush().await.ok);
    drop(sub);

    // A stock client with no option but the socket: grpcurl (grpc-go) sends the socket's path
    // as :authority, which the sidecar must not refuse.
    let socket = path.display().to_string();
    let run = |args: &[&str]| grpcurl(&[&["-plaintext", "-unix"], args].concat());
    let published = tokio::task::spawn_blocking(move || {
        let health = run(&[&socket, "grpc.health.v1.Health/Check"]);
        assert!(health.contains("SERVING"), "{health}");
        run(&[
            "-d",
            r#"{"stream":"orders","entries":[{"payload":"e30="}]}"#,
            &socket,
            "window_sidecar.v1.WindowService/Publish",
        ])
    })
    .await
    .unwrap();
    assert!(published.contains("\"ids\""), "{published}");
    let inspect = redis.client().await;
    let entries: u64 = fred::prelude::StreamsInterface::xlen(&inspect, "orders")
        .await
        .unwrap();
    assert_eq!(entries, 2);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

#[tokio::test]
async fn mutual_tls_on_the_grpc_listener() {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let redis = RedisServer::start();
    let tls = TlsMaterial::generate_temp();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (cert, key, ca) = (
        path(&tls.server_cert),
        path(&tls.server_key),
        path(&tls.ca_cert),
    );
    let sidecar = Sidecar::start(
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
    let endpoint = || Endpoint::from_shared(format!("https://{}", sidecar.addr)).unwrap();
    let ca_pem = std::fs::read(&tls.ca_cert).unwrap();

    // With the client certificate: served.
    let identity = Identity::from_pem(
        std::fs::read(&tls.client_cert).unwrap(),
        std::fs::read(&tls.client_key).unwrap(),
    );
    let channel = endpoint()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca_pem))
                .identity(identity)
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ids = WindowServiceClient::new(channel)
        .publish(publish_request())
        .await
        .unwrap();
    assert_eq!(ids.into_inner().ids.len(), 1);

    // Without one: refused at the handshake, nothing served.
    let refused = async {
        let channel = endpoint()
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&ca_pem))
                    .domain_name("localhost"),
            )
            .unwrap()
            .connect()
            .await?;
        WindowServiceClient::new(channel)
            .publish(publish_request())
            .await
            .map_err(|status| -> Box<dyn std::error::Error> { Box::new(status) })?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    assert!(
        refused.await.is_err(),
        "a client without a certificate must not be served"
    );

    // Plain text against a TLS listener is refused too.
    let plain = WindowServiceClient::connect(format!("http://{}", sidecar.addr)).await;
    let served = match plain {
        Ok(mut client) => client.publish(publish_request()).await.is_ok(),
        Err(_) => false,
    };
    assert!(!served);
    sidecar.stop().await;
}

/// A sidecar whose Redis credentials are wrong tells clients, probes and `/readyz` that the
/// login was refused with Redis' `reply` (WRONGPASS, NOAUTH), naming the user and never the
/// password. Returns the sidecar and its metrics address.
async fn assert_refused_login(
    url: &str,
    flags: &[&str],
    user: &str,
    password: &str,
    reply: &str,
) -> (Sidecar, SocketAddr) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut all = vec!["--redis-timeout", "1s", "--metrics-listen", &metrics];
    all.extend_from_slice(flags);
    let sidecar = Sidecar::start(url, &all).await;
    let metrics: SocketAddr = metrics.parse().unwrap();
    let mut client = sidecar.client().await;
    let told = |what: &str, status: &tonic::Status| {
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "{what}: {status:?}"
        );
        let message = status.message();
        assert!(
            message.contains("authentication to Redis failed")
                && message.contains(reply)
                && message.contains(&format!("user {user:?}")),
            "{what}: {message}"
        );
        assert!(!message.contains(password), "{what} leaked the password");
        assert!(
            !message.contains("did not answer in time"),
            "{what}: a refused login is not a timeout: {message}"
        );
    };

    let status = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .err()
        .expect("a subscription cannot open");
    told("Subscribe", &status);
    let status = client.publish(publish_request()).await.unwrap_err();
    told("Publish", &status);

    let channel = Endpoint::from_shared(format!("http://{}", sidecar.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let readiness = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: window_sidecar::server::SERVICE.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        readiness,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32
    );
    // The health watcher says why at its next check.
    let deadline = tokio::time::Instant::now() + STEP;
    let body = loop {
        let (status, body) = http_get(metrics, "/readyz").await;
        if status == 503 && body.contains(reply) {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(body.contains(&format!("user {user:?}")), "{body}");
    assert!(!body.contains(password), "/readyz leaked the password");
    (sidecar, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_redis_password_is_reported_as_an_authentication_failure() {
    const RIGHT: &str = "r1ght-admin-pw";
    const WRONG: &str = "wr0ng-pw-in-the-url";
    let redis = RedisServer::start_with_password(RIGHT);
    let admin = redis.client_with_auth(None, RIGHT).await;
    acl_user(&admin, "sidecar", "r1ght-sidecar-pw", "~* &* +@all").await;

    // requirepass: the default user, the password in the URL.
    let (sidecar, _) = assert_refused_login(
        &redis.url_with_auth(None, WRONG),
        &[],
        "default",
        WRONG,
        "WRONGPASS",
    )
    .await;
    sidecar.stop().await;

    // No password at all: Redis answers NOAUTH, which is the same failure.
    let (sidecar, _) = assert_refused_login(&redis.url(), &[], "default", RIGHT, "NOAUTH").await;
    sidecar.stop().await;

    // An ACL user, the password in a file (as a mounted Secret).
    let dir = std::env::temp_dir().join(format!("window-sidecar-wrongpass-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    const WRONG_IN_FILE: &str = "wr0ng-pw-in-a-file";
    std::fs::write(&file, format!("{WRONG_IN_FILE}\n")).unwrap();
    let (sidecar, metrics) = assert_refused_login(
        &redis.url(),
        &[
            "--redis-username",
            "sidecar",
            "--redis-password-file",
            file.to_str().unwrap(),
        ],
        "sidecar",
        WRONG_IN_FILE,
        "WRONGPASS",
    )
    .await;

    // The operator gives the user that password in Redis: the same sidecar serves again.
    acl_user(&admin, "sidecar", WRONG_IN_FILE, "~* &* +@all").await;
    assert!(
        eventually(STEP, || async {
            http_get(metrics, "/readyz").await.0 == 200
        })
        .await,
        "ready once the ACL accepts the password"
    );
    let mut client = sidecar.client().await;
    assert_eq!(
        client
            .publish(publish_request())
            .await
            .unwrap()
            .into_inner()
            .ids
            .len(),
        1
    );
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .expect("opens once the login is accepted");
    let d = sub.read().await.deliveries.remove(0);
    sub.send(vec![], vec![outcome(d.slot, OutcomeKind::Ack)])
        .await;
    assert!(sub.flush().await.ok);
    drop(sub);
    sidecar.stop().await;
    let _ = fred::interfaces::ClientLike::quit(&admin).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts a sidecar with its metrics port on `metrics` and waits until the port accepts
/// connections (the sidecar binds it once it runs).
async fn with_metrics_port(redis: &RedisServer, metrics: SocketAddr, flags: &[&str]) -> Sidecar {
    let listen = metrics.to_string();
    let mut all = vec!["--metrics-listen", listen.as_str()];
    all.extend_from_slice(flags);
    let sidecar = Sidecar::start(&redis.url(), &all).await;
    let local = SocketAddr::from(([127, 0, 0, 1], metrics.port()));
    assert!(
        eventually(STEP, || async {
            tokio::net::TcpStream::connect(local).await.is_ok()
        })
        .await,
        "the metrics port never opened"
    );
    sidecar
}

/// This machine's first IPv4 address that is not loopback (`ip -4 addr`), to reach a listener
/// on 0.0.0.0 as a peer from the network does.
fn non_loopback_ipv4() -> Ipv4Addr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("`ip` (iproute2) lists the addresses");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| word.split('/').next()?.parse::<Ipv4Addr>().ok())
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .expect(
            "this test needs a non-loopback IPv4 address on the machine; add one with `ip link add dummy0 type dummy && ip addr add 192.0.2.10/32 dev dummy0 && ip link set dummy0 up`",
        )
}

#[tokio::test]
async fn the_admin_view_answers_only_loopback_peers_unless_opened() {
    let redis = RedisServer::start();
    let ip = non_loopback_ipv4();
    let everywhere = |port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));

    let port = free_port();
    let sidecar = with_metrics_port(&redis, everywhere(port), &[]).await;
    let network = SocketAddr::from((ip, port));
    let (status, body) = http_get(network, "/subscriptions").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--admin-view open"), "{body}");
    assert!(body.contains(&ip.to_string()), "names the peer: {body}");
    let (status, body) = http_get(SocketAddr::from(([127, 0, 0, 1], port)), "/subscriptions").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"subscriptions\""), "{body}");
    // The rest of the port stays open to the network: Prometheus and probes reach it there.
    for path in ["/metrics", "/livez"] {
        let (status, body) = http_get(network, path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    assert!(
        eventually(STEP, || async {
            http_get(network, "/readyz").await.0 == 200
        })
        .await,
        "/readyz from the network"
    );
    sidecar.stop().await;

    let port = free_port();
    let sidecar = with_metrics_port(&redis, everywhere(port), &["--admin-view", "open"]).await;
    let (status, body) = http_get(SocketAddr::from((ip, port)), "/subscriptions").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"subscriptions\""), "{body}");
    sidecar.stop().await;

    let port = free_port();
    let local = SocketAddr::from(([127, 0, 0, 1], port));
    let sidecar = with_metrics_port(&redis, local, &["--admin-view", "off"]).await;
    let (status, body) = http_get(local, "/subscriptions").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--admin-view off"), "{body}");
    sidecar.stop().await;
}
