//! TLS with client certificates, end to end: a TLS-only `redis-server`, the in-process sidecar
//! and the generated gRPC client.

use std::time::{Duration, Instant};

use tonic::Code;
use window_sidecar_harness::*;

fn path(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

/// TLS with a client certificate: publish and consume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_publishes_and_consumes() {
    let material = TlsMaterial::generate_temp();
    let server = TlsRedisServer::start(&material, true);
    let (ca, cert, key) = (
        path(&material.ca_cert),
        path(&material.client_cert),
        path(&material.client_key),
    );
    let flags = [
        "--redis-tls-ca",
        &ca,
        "--redis-tls-cert",
        &cert,
        "--redis-tls-key",
        &key,
    ];
    let sidecar = Sidecar::start(&server.url(), &flags).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(5)).await;
    let (mut sub, _) = Subscription::open(&mut client, atomic(stream_open("orders", "g", "c1", 5)))
        .await
        .unwrap();
    consume(&mut sub, 5, |d| {
        vec![
            command(d.slot, "INCR", &["count"]),
            command(d.slot, "SADD", &["seen", &field(d, "n")]),
        ]
    })
    .await;
    let cli = |args: &[&str]| String::from_utf8_lossy(&server.cli(args).stdout).into_owned();
    assert_eq!(cli(&["GET", "count"]).trim(), "5");
    assert_eq!(cli(&["SCARD", "seen"]).trim(), "5");
    let pending = cli(&["XPENDING", "orders", "g"]);
    assert_eq!(pending.lines().next(), Some("0"), "{pending}");
    sub.close();
    sidecar.stop().await;
}

/// Trusting the CA but presenting no client certificate to a server that requires one: the
/// subscription and Publish fail with UNAVAILABLE within the Redis timeout (no hang), nothing is
/// written, and the error says what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_the_client_certificate_fails_fast_and_says_why() {
    let material = TlsMaterial::generate_temp();
    let server = TlsRedisServer::start(&material, true);
    let ca = path(&material.ca_cert);
    let sidecar = Sidecar::start(
        &server.url(),
        &["--redis-tls-ca", &ca, "--redis-timeout", "2s"],
    )
    .await;
    let mut client = sidecar.client().await;
    let started = Instant::now();
    let status = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .err()
        .expect("no subscription without a client certificate");
    let took = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let publish = try_publish(&mut client, "orders", 1)
        .await
        .expect_err("no publish without a client certificate");
    assert_eq!(publish.code(), Code::Unavailable, "{publish:?}");
    let xlen = String::from_utf8_lossy(&server.cli(&["XLEN", "orders"]).stdout).into_owned();
    assert_eq!(xlen.trim(), "0", "nothing was written");
    sidecar.stop().await;

    // What an operator reads must point at the cause: the server demands a client certificate
    // (fred sees `AlertReceived(CertificateRequired)` on every attempt), not a 0 ns timeout.
    let message = status.message().to_ascii_lowercase();
    assert!(
        message.contains("certificate") || message.contains("tls"),
        "the error does not say why Redis is unreachable: {status:?} (Publish: {publish:?})"
    );
}
