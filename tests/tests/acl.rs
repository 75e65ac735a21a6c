//! An ACL user whose key patterns exclude a side effect, end to end: a real `redis-server`,
//! the in-process sidecar and the generated gRPC client.

use fred::prelude::*;
use tonic::Code;
use window_sidecar::proto::OutcomeKind::Ack;
use window_sidecar::proto::{self, Mode};
use window_sidecar_harness::*;

const ACL_PASSWORD: &str = "Pw-0f-the.s1decar~user";

/// One ACL scenario on `stream` (whose keys the user may touch): a delivery whose side effects
/// include a key outside the user's patterns, and one whose side effects are all allowed.
async fn acl_scenario(sidecar: &Sidecar, inspect: &Client, stream: &str, mode: Mode) {
    let mut client = sidecar.client().await;
    publish(&mut client, stream, numbered(2)).await;
    let open = proto::Open {
        mode: mode as i32,
        ..stream_open(stream, "g", "c1", 2)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = sub.read().await;
    let (a, b) = (&read.deliveries[0], &read.deliveries[1]);
    let allowed = format!("allowed:{stream}");
    sub.send(
        vec![
            command(a.slot, "INCR", &[&allowed]),
            command(a.slot, "INCR", &["forbidden:count"]),
            command(b.slot, "INCR", &[&allowed]),
        ],
        vec![outcome(a.slot, Ack), outcome(b.slot, Ack)],
    )
    .await;
    let report = sub.flush().await;
    assert!(!report.ok, "{mode:?}: {report:?}");
    assert!(report.error.contains("NOPERM"), "{mode:?}: {report:?}");
    assert!(
        !report.error.contains(ACL_PASSWORD),
        "the password leaked into the report: {report:?}"
    );
    assert_eq!(counter(inspect, "forbidden:count").await, 0);
    match mode {
        Mode::Pipeline => {
            // Redis has no rollback: the other side effects and the XACK ran; the entry is
            // settled without its refused side effect (the failure is reported).
            assert_eq!(report.failed, 1, "{report:?}");
            assert!(!report.settle_failed, "{report:?}");
            assert_eq!(counter(inspect, &allowed).await, 2);
            assert_eq!(pending(inspect, stream, "g").await, 0);
        }
        Mode::Atomic => {
            // NOPERM is raised while queuing: the transaction is discarded whole, its XACK with
            // it; b's transaction commits on its own.
            assert_eq!(report.aborted, 1, "{report:?}");
            assert!(report.settle_failed, "{report:?}");
            assert_eq!(counter(inspect, &allowed).await, 1);
            assert_eq!(pending(inspect, stream, "g").await, 1);
            // The entry comes back; the client settles it without the forbidden key.
            let again = sub.read().await.deliveries.remove(0);
            assert_eq!(again.entry_id, a.entry_id);
            assert_eq!(again.delivery_count, 2);
            sub.send(
                vec![command(again.slot, "INCR", &[&allowed])],
                vec![outcome(again.slot, Ack)],
            )
            .await;
            let report = sub.flush().await;
            assert!(report.ok, "{report:?}");
            assert_eq!(counter(inspect, &allowed).await, 2);
            assert_eq!(pending(inspect, stream, "g").await, 0);
        }
        Mode::Unspecified => unreachable!(),
    }
    sub.close();
}

/// An ACL user whose key patterns exclude a side-effect key, with the credentials given as
/// flags and in the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_access_to_a_side_effect_key() {
    let redis = RedisServer::start_with_password("admin-pw");
    let admin = redis.client_with_auth(None, "admin-pw").await;
    // The sidecar's own keys: the streams and their `{key}:window:…` companions (the delay
    // set), plus `allowed:*` for side effects.
    acl_user(
        &admin,
        "sidecar",
        ACL_PASSWORD,
        "~orders* ~{orders*}:window:* ~allowed:* +@all -@dangerous",
    )
    .await;

    let flags = Sidecar::start(
        &redis.url(),
        &[
            "--redis-username",
            "sidecar",
            "--redis-password",
            ACL_PASSWORD,
        ],
    )
    .await;
    acl_scenario(&flags, &admin, "orders-flags-pipeline", Mode::Pipeline).await;
    acl_scenario(&flags, &admin, "orders-flags-atomic", Mode::Atomic).await;
    flags.stop().await;

    let in_url = Sidecar::start(&redis.url_with_auth(Some("sidecar"), ACL_PASSWORD), &[]).await;
    acl_scenario(&in_url, &admin, "orders-url-pipeline", Mode::Pipeline).await;
    acl_scenario(&in_url, &admin, "orders-url-atomic", Mode::Atomic).await;

    // A stream outside the user's patterns cannot be opened: the status says why, without the
    // password.
    let mut client = in_url.client().await;
    let status = Subscription::open(&mut client, stream_open("secret", "g", "c1", 1))
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("NOPERM"), "{status:?}");
    assert!(!status.message().contains(ACL_PASSWORD), "{status:?}");
    in_url.stop().await;

    // A wrong password: the subscription fails in bounded time with the refused login, without
    // echoing the password.
    let wrong = "Wr0ng-pa55word";
    let denied = Sidecar::start(
        &redis.url(),
        &[
            "--redis-username",
            "sidecar",
            "--redis-password",
            wrong,
            "--redis-timeout",
            "1s",
        ],
    )
    .await;
    let mut client = denied.client().await;
    let status = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("WRONGPASS") && status.message().contains("user \"sidecar\""),
        "says the login was refused, and for whom: {status:?}"
    );
    assert!(!status.message().contains(wrong), "{status:?}");
    denied.stop().await;
    let _ = admin.quit().await;
}
