//! Redrives and purges refused before anything moves. By the sidecar: a key outside
//! `--allow-keys`, a request without a target or a selection. By Redis: a destination of
//! another type, no memory left, a user that may not delete dead letters (so that no redrive
//! leaves a dead letter and its copy both). Every dead letter refused stays as it was, and the
//! command and the service say, letter by letter, which moved and why the others did not.

use std::collections::HashMap;

use bytes::Bytes;
use fred::prelude::*;
use tonic::Code;
use tonic::transport::Channel;
use window_sidecar::domain::frame;
use window_sidecar::proto;
use window_sidecar::proto::dead_letter_service_client::DeadLetterServiceClient;
use window_sidecar_harness::dead_letters::{
    ListDeadLetters, StreamDeadLetters, admin, all, append, cli, ids, list, stream,
};
use window_sidecar_harness::{
    RedisServer, Sidecar, acl_user, free_port, pending_rows, resp, url_with_auth,
};

/// `--allow-keys` holds for the admin service: a dead letter outside it is not read, and a
/// redrive to a key outside it is PERMISSION_DENIED naming the key, before anything moves.
/// Bad requests are INVALID_ARGUMENT saying what to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_service_keeps_to_the_allowed_keys_and_says_what_is_wrong() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let _: String = client
        .xadd(
            "app:dead",
            false,
            None,
            "*",
            vec![
                ("_payload", "p"),
                ("h:x-window-original-id", "1-0"),
                ("h:x-window-subscription", "secret:orders/g"),
            ],
        )
        .await
        .unwrap();
    let sidecar = Sidecar::start(&redis.url(), &["--allow-keys", "app:*"]).await;
    let addr = sidecar.addr.to_string();
    let mut admin = admin(&addr).await;
    let refused = admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target: stream("app:dead"),
            selection: all(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("secret:orders"),
        "{}",
        refused.message()
    );
    let len: u64 = client.xlen("app:dead").await.unwrap();
    assert_eq!(len, 1, "nothing moved");
    let refused = admin
        .list_dead_letters(proto::ListDeadLettersRequest {
            target: stream("other:dead"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("other:dead"));

    let no_selection = admin
        .purge_dead_letters(proto::PurgeDeadLettersRequest {
            target: stream("app:dead"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(no_selection.code(), Code::InvalidArgument);
    assert!(
        no_selection.message().contains("all: true"),
        "{}",
        no_selection.message()
    );
    let no_target = admin
        .list_dead_letters(proto::ListDeadLettersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(no_target.code(), Code::InvalidArgument);

    // The command says the same, naming the stream, and exits 77 (EX_NOPERM); a malformed
    // target is a usage error (64).
    let (code, _, err) = cli(&addr, &["redrive", "stream:app:dead", "--all"]);
    assert_eq!(code, 77, "{err}");
    assert!(
        err.contains("secret:orders")
            && err.contains("PermissionDenied")
            && err.contains("stream app:dead"),
        "{err}"
    );
    let (code, _, err) = cli(&addr, &["list", "app:dead"]);
    assert_eq!(code, 64, "{err}");
    let port = free_port();
    let (code, _, err) = cli(&format!("127.0.0.1:{port}"), &["list", "stream:app:dead"]);
    assert_eq!(code, 69, "{err}");
    assert!(
        err.contains(&format!(
            "No sidecar at 127.0.0.1:{port} (connection refused)"
        )),
        "{err}"
    );
    sidecar.stop().await;
}

async fn redrive_all(
    admin: &mut DeadLetterServiceClient<Channel>,
    target: Option<proto::DeadLetterTarget>,
) -> Vec<proto::Redriven> {
    admin
        .redrive_dead_letters(proto::RedriveDeadLettersRequest {
            target,
            selection: all(),
            per_second: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .redriven
}

/// A stream redrive Redis refuses (the destination holds a hash: WRONGTYPE) leaves every dead
/// letter in place and the destination untouched; the command names each refused dead letter
/// with Redis's error and exits 1, and the service reports, letter by letter, which moved and
/// which Redis refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_redrive_redis_refuses_leaves_the_dead_letters_in_place() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let mut admin = admin(addr).await;
    let before = ids(&on.listed(&mut admin).await.dead_letters);
    let _: i64 = client.hset("dl:totals", ("apple", 1)).await.unwrap();

    let (code, out, err) = cli(
        addr,
        &[
            "redrive",
            "stream:dl:orders:dead",
            "--all",
            "--to",
            "dl:totals",
        ],
    );
    let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(len, 3, "every dead letter is still there: {out}{err}");
    assert_eq!(ids(&on.listed(&mut admin).await.dead_letters), before);
    let totals: HashMap<String, String> = client.hgetall("dl:totals").await.unwrap();
    assert_eq!(totals, HashMap::from([("apple".into(), "1".into())]));
    assert_eq!(code, 1, "{out}{err}");
    for id in &before {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("refused {id}: ")))
            .unwrap_or_else(|| panic!("{id} is said to be refused: {out}"));
        assert!(line.contains("WRONGTYPE"), "{line}");
    }
    assert!(out.contains("0 of 3 dead letters redriven"), "{out}");
    assert!(err.contains("3 dead letters"), "{err}");

    // One whose origin is the hash among three that go home: those move, it stays.
    let odd: String = client
        .xadd(
            "dl:orders:dead",
            false,
            None,
            "*",
            vec![
                ("_payload", "d"),
                ("h:x-window-original-id", "1-0"),
                ("h:x-window-subscription", "dl:totals/billing"),
            ],
        )
        .await
        .unwrap();
    let done = redrive_all(&mut admin, stream("dl:orders:dead")).await;
    assert_eq!(done.len(), 4, "{done:?}");
    for moved in &done[..3] {
        assert!(
            moved.skipped.is_empty() && !moved.new_id.is_empty(),
            "{moved:?}"
        );
    }
    assert_eq!(done[3].id, odd);
    assert_eq!(
        (done[3].to.as_str(), done[3].group.as_str()),
        ("dl:totals", "billing")
    );
    assert!(done[3].new_id.is_empty());
    assert!(
        done[3].skipped.contains("WRONGTYPE") && done[3].skipped.contains("still a dead letter"),
        "{:?}",
        done[3].skipped
    );
    let left = on.listed(&mut admin).await.dead_letters;
    assert_eq!(ids(&left), [odd]);
    on.sidecar.stop().await;
}

/// A list redrive Redis refuses leaves the dead letters in place: redriven `--to` a string,
/// every one stays, byte for byte, and the command exits 1 naming each; when one's origin now
/// holds a string, it stays while the others move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_redrive_redis_refuses_leaves_the_dead_letters_in_place() {
    let on = ListDeadLetters::start().await;
    let client = &on.client;
    let mut admin = admin(&on.addr).await;
    let _: () = client
        .set("dl:mail", "a string now", None, None, false)
        .await
        .unwrap();
    let before: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(before.len(), 5);

    let (code, out, err) = cli(
        &on.addr,
        &["redrive", "list:dl:jobs:dead", "--all", "--to", "dl:mail"],
    );
    let after: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(
        after, before,
        "every dead letter is still there as it was: {out}{err}"
    );
    let mail: String = client.get("dl:mail").await.unwrap();
    assert_eq!(mail, "a string now");
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("refused ")).count(),
        5,
        "{out}"
    );
    assert!(out.contains("WRONGTYPE"), "{out}");
    assert!(out.contains("0 of 5 dead letters redriven"), "{out}");

    // Each to its origin: m1's is the string.
    let done = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    assert_eq!(done.len(), 5, "{done:?}");
    assert!(done[0].skipped.is_empty() && done[1].skipped.is_empty());
    assert_eq!(done[2].to, "dl:mail");
    assert!(
        done[2].skipped.contains("WRONGTYPE") && done[2].skipped.contains("still a dead letter"),
        "{:?}",
        done[2].skipped
    );
    assert!(done[3].skipped.contains("redrive it with `to`"));
    let dead: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 3, "m1 and the two without an origin stay");
    assert!(dead.iter().all(|v| before.contains(v)));
    let jobs: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!(jobs, 2);
    on.sidecar.stop().await;
}

/// Under `maxmemory` with `noeviction` Redis refuses the redrive whole, before it writes
/// anything: every dead letter, stream and list, stays; once Redis has memory again the same
/// redrive moves them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_refused_for_memory_leaves_the_dead_letters_in_place() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let port = on.redis.port();
    let frame = frame::encode(&[
        (Bytes::from_static(b"_payload"), Bytes::from_static(b"j1")),
        (
            Bytes::from_static(b"h:x-window-subscription"),
            Bytes::from_static(b"dl:jobs"),
        ),
    ]);
    let _: i64 = client.lpush("dl:jobs:dead", frame.to_vec()).await.unwrap();
    let origin_before: u64 = client.xlen("dl:orders").await.unwrap();
    let config = |args: &[&str]| {
        let mut call = vec!["CONFIG", "SET"];
        call.extend(args);
        let reply = resp::call(port, &call).unwrap();
        assert_eq!(reply.text(), "OK", "CONFIG SET {args:?}");
    };
    config(&["maxmemory-policy", "noeviction"]);
    config(&["maxmemory", "1"]);

    let (code, out, err) = cli(addr, &["redrive", "stream:dl:orders:dead", "--all"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("OOM"), "{out}");
    assert!(out.contains("0 of 3 dead letters redriven"), "{out}");
    let mut admin = admin(addr).await;
    let done = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    assert_eq!(done.len(), 1);
    assert!(done[0].skipped.contains("OOM"), "{done:?}");

    let dead: u64 = client.xlen("dl:orders:dead").await.unwrap();
    let origin: u64 = client.xlen("dl:orders").await.unwrap();
    assert_eq!((dead, origin), (3, origin_before), "nothing moved");
    assert!(
        pending_rows(client, "dl:orders", "billing")
            .await
            .is_empty()
    );
    let dead: Vec<Bytes> = client.lrange("dl:jobs:dead", 0, -1).await.unwrap();
    assert_eq!(dead, [frame]);
    let jobs: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!(jobs, 0);

    config(&["maxmemory", "0"]);
    let (code, out, err) = cli(addr, &["redrive", "stream:dl:orders:dead", "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("3 of 3 dead letters redriven"), "{out}");
    assert_eq!(pending_rows(client, "dl:orders", "billing").await.len(), 3);
    let done = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    assert!(done[0].skipped.is_empty(), "{done:?}");
    let jobs: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!(jobs, 1);
    on.sidecar.stop().await;
}

/// A sidecar whose Redis user may write the origins but not delete dead letters (`-xdel
/// -lrem`): a redrive puts nothing back (a stream entry into its group, a list copy) that it
/// could not follow by removing the dead letter (which would leave both), so each is refused
/// with NOPERM and stays; a purge fails saying where it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_may_not_delete_dead_letters_redrives_and_purges_nothing() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", "dl:orders", "g", "$", "MKSTREAM"],
        )
        .await
        .unwrap();
    for p in ["x", "y"] {
        let entry = append(&client, "dl:orders", p).await;
        let _: String = client
            .xadd(
                "dl:orders:dead",
                false,
                None,
                "*",
                vec![
                    ("_payload", p),
                    ("h:x-window-original-id", entry.as_str()),
                    ("h:x-window-subscription", "dl:orders/g"),
                ],
            )
            .await
            .unwrap();
    }
    let value = frame::encode(&[
        (Bytes::from_static(b"_payload"), Bytes::from_static(b"j")),
        (
            Bytes::from_static(b"h:x-window-subscription"),
            Bytes::from_static(b"dl:jobs"),
        ),
    ]);
    let _: i64 = client.lpush("dl:jobs:dead", value.to_vec()).await.unwrap();
    acl_user(&client, "keeper", "pw", "~* &* +@all -xdel -lrem").await;
    let url = url_with_auth(&redis.url(), Some("keeper"), "pw");
    let sidecar = Sidecar::start(&url, &[]).await;
    let mut admin = admin(&sidecar.addr.to_string()).await;

    let done = redrive_all(&mut admin, stream("dl:orders:dead")).await;
    let done_list = redrive_all(&mut admin, list("dl:jobs:dead")).await;
    for r in done.iter().chain(&done_list) {
        assert!(
            r.skipped.contains("NOPERM") && r.skipped.contains("still a dead letter"),
            "{r:?}"
        );
    }
    assert_eq!((done.len(), done_list.len()), (2, 1));
    let dead: u64 = client.xlen("dl:orders:dead").await.unwrap();
    let origin: u64 = client.xlen("dl:orders").await.unwrap();
    assert_eq!((dead, origin), (2, 2), "no copy beside a dead letter");
    assert!(
        pending_rows(&client, "dl:orders", "g").await.is_empty(),
        "nothing pending again beside a dead letter"
    );
    let dead: u64 = client.llen("dl:jobs:dead").await.unwrap();
    let copies: u64 = client.llen("dl:jobs").await.unwrap();
    assert_eq!((dead, copies), (1, 0));

    let refused = admin
        .purge_dead_letters(proto::PurgeDeadLettersRequest {
            target: stream("dl:orders:dead"),
            selection: all(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("NOPERM")
            && refused
                .message()
                .contains("0 of the 2 dead letters chosen were purged before it"),
        "{}",
        refused.message()
    );
    let dead: u64 = client.xlen("dl:orders:dead").await.unwrap();
    assert_eq!(dead, 2);
    sidecar.stop().await;
}
