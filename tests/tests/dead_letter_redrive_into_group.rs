//! A stream's dead letter redriven back into the consumer group that gave up on it: the same
//! entry, pending in that group alone with its count reset, never a copy that the stream's
//! other groups would read. One whose entry was trimmed, whose group is gone or that says
//! nothing of its entry stays a dead letter (`--to` then writes a copy), as does one Redis will
//! not let the sidecar claim back.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar_harness::dead_letters::{
    REASON, admin, append, cli, dead_letter_through, stream, stream_dead_letter,
};
use window_sidecar_harness::{
    Next, RedisServer, Sidecar, Worker, acl_user, pending_rows, stream_open, url_with_auth,
};

/// `rg:orders` with groups `a` and `b`, both created before its entries, and dead letters on
/// `rg:orders:dead`.
const ORIGIN: &str = "rg:orders";
const DEAD: &str = "rg:orders:dead";

/// Writes a dead letter as the sidecar writes one for the entry `entry_id` of `ORIGIN`, given
/// up on by `group` (fields as `Entry::dead_letter_fields` lays them out); returns its id.
async fn dead_letter_of(client: &Client, group: &str, entry_id: &str, payload: &str) -> String {
    let subscription = format!("{ORIGIN}/{group}");
    client
        .xadd(
            DEAD,
            false,
            None,
            "*",
            vec![
                ("_payload", payload),
                ("h:x-window-original-id", entry_id),
                ("h:x-window-subscription", subscription.as_str()),
                ("h:x-window-deliveries", "5"),
                ("h:x-ruststream-retry-count", "5"),
                ("h:x-window-reason", REASON),
            ],
        )
        .await
        .unwrap()
}

/// The ids a plain consumer `cb` of `group` reads as new (`XREADGROUP … >`), acked at once.
async fn read_new(client: &Client, key: &str, group: &str) -> Vec<String> {
    let reply: Value = client
        .custom(
            fred::cmd!("XREADGROUP"),
            vec!["GROUP", group, "cb", "COUNT", "100", "STREAMS", key, ">"],
        )
        .await
        .unwrap();
    let mut ids = Vec::new();
    if let Value::Array(streams) = reply {
        for stream in streams {
            let Value::Array(mut parts) = stream else {
                panic!("XREADGROUP: {stream:?}")
            };
            let Value::Array(entries) = parts.remove(1) else {
                panic!("XREADGROUP entries")
            };
            for entry in entries {
                let Value::Array(entry) = entry else {
                    panic!("XREADGROUP entry: {entry:?}")
                };
                ids.push(entry[0].as_string().unwrap());
            }
        }
    }
    for id in &ids {
        let _: u64 = client.xack(key, group, id.as_str()).await.unwrap();
    }
    ids
}

/// `ORIGIN` with groups `a` and `b` and `n` entries, each read and acknowledged by group `b`;
/// returns their ids.
async fn two_groups(client: &Client, n: usize) -> Vec<String> {
    let _: Value = client
        .custom(
            fred::cmd!("XGROUP"),
            vec!["CREATE", ORIGIN, "a", "$", "MKSTREAM"],
        )
        .await
        .unwrap();
    let _: () = client.xgroup_create(ORIGIN, "b", "$", false).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(append(client, ORIGIN, &format!("p{i}")).await);
    }
    assert_eq!(read_new(client, ORIGIN, "b").await, ids);
    ids
}

/// A stream dead letter redriven back to its origin re-enters only the group it came from:
/// group `a`, which gave up on the entry, gets the same entry id back once, its count
/// restarted, through a live subscription's reclaim; group `b`, which had acknowledged it,
/// reads nothing new and has nothing pending; the stream gets no new entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_redrive_puts_the_entry_back_into_its_own_group_only() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let ids = two_groups(&client, 1).await;
    let entry = &ids[0];
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "200ms"]).await;
    let addr = sidecar.addr.to_string();
    dead_letter_through(
        &addr,
        stream_open(ORIGIN, "a", "c1", 8),
        stream_dead_letter(DEAD),
        1,
    )
    .await;
    let mut admin = admin(&addr).await;
    let listed = admin
        .list_dead_letters(proto::ListDeadLettersRequest {
            target: stream(DEAD),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert_eq!(listed.len(), 1);
    let letter = &listed[0].id;
    assert!(pending_rows(&client, ORIGIN, "a").await.is_empty());
    let origin_len: u64 = client.xlen(ORIGIN).await.unwrap();

    let (code, out, err) = cli(&addr, &["redrive", &format!("stream:{DEAD}"), "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "redrove {letter} back into group a of {ORIGIN} as {entry}"
        )),
        "{out}"
    );
    assert!(out.contains("1 of 1 dead letters redriven"), "{out}");
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    let len: u64 = client.xlen(ORIGIN).await.unwrap();
    assert_eq!((dead, len), (0, origin_len), "no new entry in the stream");
    assert_eq!(
        pending_rows(&client, ORIGIN, "a").await,
        [(entry.clone(), "window:redriven".to_owned(), 0)],
        "pending in its group again, its count reset"
    );
    assert!(pending_rows(&client, ORIGIN, "b").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());

    // Group a's live subscriber reclaims it: the same entry, once, as a first delivery.
    let mut worker = Worker::open(&addr, stream_open(ORIGIN, "a", "c1", 8)).await;
    let read = worker.next_read().await;
    assert_eq!(read.deliveries.len(), 1, "{read:?}");
    let d = &read.deliveries[0];
    assert_eq!(&d.entry_id, entry);
    assert_eq!(d.payload.as_ref(), b"p0");
    assert_eq!(d.delivery_count, 1, "the count restarts");
    worker.ack(&read.deliveries).await;
    worker
        .report_for(read.read_id, Duration::from_secs(5))
        .await
        .expect("the ack is flushed");
    assert!(
        matches!(worker.next(Duration::from_secs(1)).await, Next::Idle),
        "delivered once"
    );
    worker.close();
    assert!(pending_rows(&client, ORIGIN, "a").await.is_empty());
    assert!(pending_rows(&client, ORIGIN, "b").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());
    let len: u64 = client.xlen(ORIGIN).await.unwrap();
    assert_eq!(len, origin_len);
    sidecar.stop().await;
}

/// A stream dead letter that cannot re-enter its group alone stays where it is, each said so
/// per letter: its entry trimmed from the stream (the command names --to), its group gone
/// (NOGROUP, exit 1), or no record of the entry it was. `--to` naming the origin itself then
/// appends a copy, which every group of the stream reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dead_letter_that_cannot_reenter_its_group_stays() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let ids = two_groups(&client, 3).await;
    // Group a read them and gave up on each.
    assert_eq!(read_new(&client, ORIGIN, "a").await, ids);
    let trimmed = dead_letter_of(&client, "a", &ids[0], "p0").await;
    let no_group = dead_letter_of(&client, "gone", &ids[1], "p1").await;
    let no_entry: String = client
        .xadd(
            DEAD,
            false,
            None,
            "*",
            vec![
                ("_payload", "p2"),
                ("h:x-window-subscription", "rg:orders/a"),
            ],
        )
        .await
        .unwrap();
    let _: u64 = client
        .custom(fred::cmd!("XTRIM"), vec![ORIGIN, "MINID", ids[1].as_str()])
        .await
        .unwrap();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    let spec = format!("stream:{DEAD}");

    let (code, out, err) = cli(&addr, &["redrive", &spec, "--all"]);
    assert_eq!(code, 1, "NOGROUP is Redis refusing: {out}{err}");
    let line = |id: &str| {
        out.lines()
            .find(|l| l.contains(&format!(" {id}: ")))
            .unwrap_or_else(|| panic!("{id} is reported: {out}"))
            .to_owned()
    };
    let said = line(&trimmed);
    assert!(
        said.starts_with(&format!("skipped {trimmed}: "))
            && said.contains(&format!(
                "its entry {} is no longer in {ORIGIN} (trimmed by retention, or deleted)",
                ids[0]
            ))
            && said.contains("still a dead letter")
            && said.contains("--to")
            && !said.contains("`to`"),
        "{said}"
    );
    let said = line(&no_group);
    assert!(
        said.starts_with(&format!("refused {no_group}: "))
            && said.contains(&format!(
                "NOGROUP stream {ORIGIN} has no consumer group gone"
            ))
            && said.contains("still a dead letter"),
        "{said}"
    );
    let said = line(&no_entry);
    assert!(
        said.starts_with(&format!("skipped {no_entry}: "))
            && said.contains("x-window-original-id")
            && said.contains("--to"),
        "{said}"
    );
    assert!(out.contains("0 of 3 dead letters redriven"), "{out}");
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    assert_eq!(dead, 3, "every dead letter stays");
    assert!(pending_rows(&client, ORIGIN, "a").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());
    let len: u64 = client.xlen(ORIGIN).await.unwrap();
    assert_eq!(len, 2);

    // --to naming the origin itself is a copy: a new entry, for every group of the stream.
    let (code, out, err) = cli(&addr, &["redrive", &spec, "--id", &trimmed, "--to", ORIGIN]);
    assert_eq!(code, 0, "{out}{err}");
    let copy = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("redrove {trimmed} to {ORIGIN} as ")))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    assert_eq!(
        read_new(&client, ORIGIN, "a").await,
        std::slice::from_ref(&copy)
    );
    assert_eq!(read_new(&client, ORIGIN, "b").await, [copy]);
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    assert_eq!(dead, 2);
    sidecar.stop().await;
}

/// A sidecar whose Redis user may not run XCLAIM redrives no stream dead letter back into its
/// group: Redis refuses it before anything is written (NOPERM), the dead letter stays and the
/// group has nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_into_a_group_redis_refuses_leaves_the_dead_letter() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let ids = two_groups(&client, 1).await;
    assert_eq!(read_new(&client, ORIGIN, "a").await, ids);
    let letter = dead_letter_of(&client, "a", &ids[0], "p0").await;
    acl_user(&client, "reader", "pw", "~* &* +@all -xclaim").await;
    let sidecar = Sidecar::start(&url_with_auth(&redis.url(), Some("reader"), "pw"), &[]).await;
    let addr = sidecar.addr.to_string();

    let (code, out, err) = cli(&addr, &["redrive", &format!("stream:{DEAD}"), "--all"]);
    assert_eq!(code, 1, "{out}{err}");
    let said = out
        .lines()
        .find(|l| l.starts_with(&format!("refused {letter}: ")))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        said.contains(&format!("to {ORIGIN} (group a)"))
            && said.contains("NOPERM")
            && said.contains("still a dead letter"),
        "{said}"
    );
    let dead: u64 = client.xlen(DEAD).await.unwrap();
    assert_eq!(dead, 1);
    assert!(pending_rows(&client, ORIGIN, "a").await.is_empty());
    assert!(read_new(&client, ORIGIN, "b").await.is_empty());
    sidecar.stop().await;
}
