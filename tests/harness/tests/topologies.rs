//! Each topology of the harness, proven against real processes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar_harness::{
    RedisCluster, RedisServer, Sentinels, TlsMaterial, TlsRedisServer, acl_user, eventually,
    info_field, resp, slot_of,
};

fn process_gone(pid: u32) -> bool {
    !PathBuf::from(format!("/proc/{pid}")).exists()
}

/// `WAIT 1 1000` on the node serving `key`, through the connection that wrote to it.
async fn wait_one_replica(client: &Client, port: u16) {
    let acked: i64 = client
        .with_cluster_node(Server::new("127.0.0.1", port))
        .custom(fred::cmd!("WAIT"), vec![1, 1000])
        .await
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica of {port} acknowledged the writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_and_restart() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    let startup = started.elapsed();
    eprintln!("cluster of 3+3 started in {startup:?}");
    assert!(startup < Duration::from_secs(10), "slow start: {startup:?}");
    assert_eq!(cluster.ports().len(), 6);
    let primaries = cluster.primaries();
    assert_eq!(primaries.len(), 3);
    for &p in &primaries {
        assert_eq!(cluster.replicas_of(p).len(), 1, "one replica for {p}");
    }
    let url = cluster.url();
    assert!(url.starts_with("redis-cluster://127.0.0.1:"), "{url}");
    assert_eq!(url.matches("node=127.0.0.1:").count(), 2, "{url}");

    let client = cluster.client().await;
    // Keys spread over all primaries.
    let keys: Vec<String> = (0..60).map(|i| format!("key:{i}")).collect();
    for key in &keys {
        let _: () = client
            .set(key, key.as_str(), None, None, false)
            .await
            .unwrap();
    }
    let owners: BTreeSet<u16> = keys
        .iter()
        .map(|k| cluster.primary_for_slot(slot_of(k)))
        .collect();
    assert_eq!(owners.len(), 3, "keys on every primary");

    let slot = slot_of("key:0");
    let old = cluster.primary_for_slot(slot);
    let replica = cluster.replicas_of(old)[0];
    wait_one_replica(&client, old).await;
    let old_pid = cluster.pid(old).unwrap();

    let killed = Instant::now();
    cluster.kill(old);
    assert!(process_gone(old_pid));
    let new = cluster.wait_for_failover(slot, old, Duration::from_secs(20));
    eprintln!("cluster failover took {:?}", killed.elapsed());
    assert_eq!(new, replica, "the replica was promoted");
    assert_eq!(cluster.primary_for_slot(slot), new);

    // The same client finds the new primary; every key written before is still there.
    for key in &keys {
        let value: Option<String> = client.get(key).await.unwrap();
        assert_eq!(value.as_deref(), Some(key.as_str()), "{key} after failover");
    }
    let _: () = client
        .set("key:0", "after", None, None, false)
        .await
        .unwrap();

    let restarted = Instant::now();
    cluster.restart(old);
    eprintln!("restart + rejoin took {:?}", restarted.elapsed());
    assert_eq!(
        cluster.replicas_of(new),
        vec![old],
        "the old primary rejoined as a replica"
    );
    assert_eq!(cluster.primaries().len(), 3);
    let role = resp::call(old, &["ROLE"]).unwrap();
    assert_eq!(role.items()[0].text(), "slave");

    // A fresh client from url() works too.
    let fresh = cluster.client().await;
    let value: Option<String> = fresh.get("key:0").await.unwrap();
    assert_eq!(value.as_deref(), Some("after"));

    // Drop kills every node and removes their dirs.
    let pids: Vec<u32> = cluster
        .ports()
        .iter()
        .filter_map(|&p| cluster.pid(p))
        .collect();
    assert_eq!(pids.len(), 6);
    let _ = client.quit().await;
    let _ = fresh.quit().await;
    drop(cluster);
    assert!(pids.iter().all(|&pid| process_gone(pid)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slot_migration() {
    let cluster = RedisCluster::start(3, 0);
    let client = cluster.client().await;

    // 150 keys in one slot (hash tag), so MIGRATE runs in more than one batch.
    let keys: Vec<String> = (0..150).map(|i| format!("{{mig}}:{i}")).collect();
    for key in &keys {
        let _: () = client
            .set(key, key.as_str(), None, None, false)
            .await
            .unwrap();
    }
    let slot = slot_of(&keys[0]);
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();

    // Half-way: some keys moved, the rest not; reads follow -ASK redirections.
    let migration = cluster.begin_slot_migration(slot, to);
    assert_eq!((migration.from, migration.to), (from, to));
    assert_eq!(cluster.move_slot_keys(&migration, 60), 60);
    let count = |port: u16| {
        resp::call(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .unwrap()
            .as_int()
            .unwrap()
    };
    assert_eq!((count(from), count(to)), (90, 60));
    let first_key = |port: u16| {
        let keys = resp::call(port, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1"]).unwrap();
        keys.items()[0].text()
    };
    let (moved_key, kept_key) = (first_key(to), first_key(from));
    // Redis-level redirections: the source answers -ASK for a moved key, the target serves it
    // only after ASKING and answers -MOVED otherwise.
    let ask = resp::call(from, &["GET", moved_key.as_str()]).unwrap_err();
    assert_eq!(ask, format!("ASK {slot} 127.0.0.1:{to}"));
    let mut target = resp::Conn::connect(to).unwrap();
    let moved = target.call(&["GET", moved_key.as_str()]).unwrap();
    assert_eq!(
        moved,
        resp::Reply::Error(format!("MOVED {slot} 127.0.0.1:{from}"))
    );
    assert_eq!(
        target.call(&["ASKING"]).unwrap(),
        resp::Reply::Status("OK".into())
    );
    let value = target.call(&["GET", moved_key.as_str()]).unwrap();
    assert_eq!(value, resp::Reply::Bulk(moved_key.clone().into_bytes()));
    // The clustered client reads keys still on the source as usual (keys already moved: see
    // `fred_follows_ask_redirects_mid_migration`).
    let value: Option<String> = client.get(&kept_key).await.unwrap();
    assert_eq!(value.as_deref(), Some(kept_key.as_str()));
    cluster.finish_slot_migration(migration);
    assert_eq!(cluster.primary_for_slot(slot), to);
    assert_eq!((count(from), count(to)), (0, 150));

    // The client follows -MOVED; writes land on the new owner.
    for key in &keys {
        let value: Option<String> = client.get(key).await.unwrap();
        assert_eq!(
            value.as_deref(),
            Some(key.as_str()),
            "{key} after migration"
        );
    }
    let _: () = client
        .set("{mig}:new", "1", None, None, false)
        .await
        .unwrap();
    assert_eq!(count(to), 151);

    // migrate_slot in one go: back to the original owner.
    cluster.migrate_slot(slot, from);
    assert_eq!(cluster.primary_for_slot(slot), from);
    let value: Option<String> = client.get("{mig}:7").await.unwrap();
    assert_eq!(value.as_deref(), Some("{mig}:7"));
    assert_eq!(count(from), 151);

    let owners: BTreeMap<(u16, u16), u16> = cluster.slot_owners();
    let covered: u32 = owners.keys().map(|&(a, b)| u32::from(b - a) + 1).sum();
    assert_eq!(covered, 16384);
    let _ = client.quit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover() {
    let started = Instant::now();
    let mut sentinels = Sentinels::start(3);
    eprintln!("sentinels started in {:?}", started.elapsed());
    assert_eq!(sentinels.service_name(), "mymaster");
    let url = sentinels.url();
    assert!(
        url.starts_with("redis-sentinel://127.0.0.1:")
            && url.contains("sentinelServiceName=mymaster"),
        "{url}"
    );
    assert_eq!(url.matches("&node=127.0.0.1:").count(), 2, "{url}");

    let old = sentinels.primary_port();
    let replica = sentinels.replica_ports()[0];
    let client = sentinels.primary_client().await;
    let _: () = client
        .set("greeting", "hello", None, None, false)
        .await
        .unwrap();
    let acked: i64 = client
        .custom(fred::cmd!("WAIT"), vec![1, 1000])
        .await
        .unwrap();
    assert_eq!(acked, 1);

    let killed = Instant::now();
    assert_eq!(sentinels.kill_primary(), old);
    let new = sentinels.wait_for_failover(Duration::from_secs(30));
    eprintln!("sentinel failover took {:?}", killed.elapsed());
    assert_eq!(new, replica);
    assert_eq!(sentinels.primary_port(), new);

    // A client built from url() now lands on the new primary.
    let fresh = sentinels.primary_client().await;
    let port: Value = fresh
        .custom(fred::cmd!("CONFIG"), vec!["GET", "port"])
        .await
        .unwrap();
    assert_eq!(
        port.into_array()
            .get(1)
            .and_then(Value::as_string)
            .as_deref(),
        Some(new.to_string().as_str())
    );
    let value: Option<String> = fresh.get("greeting").await.unwrap();
    assert_eq!(value.as_deref(), Some("hello"));
    let _: () = fresh.set("after", "1", None, None, false).await.unwrap();

    // The client from before the failover reconnects through the sentinels too.
    let recovered = eventually(Duration::from_secs(10), || async {
        client
            .get::<Option<String>, _>("after")
            .await
            .ok()
            .flatten()
            .as_deref()
            == Some("1")
    })
    .await;
    assert!(recovered, "the old client reached the new primary");

    // The old primary comes back as a replica of the new one.
    sentinels.restart(old);
    assert_eq!(sentinels.replica_ports(), vec![old]);
    let _ = client.quit().await;
    let _ = fresh.quit().await;
}

#[tokio::test]
async fn tls_server_requires_client_certificates() {
    let material = TlsMaterial::generate_temp();
    for path in [
        &material.ca_cert,
        &material.server_cert,
        &material.server_key,
        &material.client_cert,
        &material.client_key,
    ] {
        assert!(path.exists(), "{}", path.display());
    }
    let dir = material.dir.clone();

    let mutual = TlsRedisServer::start(&material, true);
    assert_eq!(
        mutual.url(),
        format!("rediss://127.0.0.1:{}", mutual.port())
    );
    let ok = mutual.cli(&["PING"]);
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "PONG");
    // Without a client certificate the handshake is refused.
    let denied = mutual.cli_with(&material.cli_args(false), &["PING"]);
    assert_ne!(String::from_utf8_lossy(&denied.stdout).trim(), "PONG");
    // Plain RESP on the TLS port gets nowhere.
    assert!(resp::call(mutual.port(), &["PING"]).is_err());

    let one_way = RedisServer::start_tls(&material, false);
    let ok = one_way.cli_with(&material.cli_args(false), &["PING"]);
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "PONG");

    drop((mutual, one_way));
    drop(material);
    assert!(!dir.exists(), "temp tls dir removed");
}

#[tokio::test]
async fn password_and_acl_users() {
    let server = RedisServer::start_with_password("s3cr&t");
    let admin = server.client_with_auth(None, "s3cr&t").await;
    acl_user(&admin, "sidecar", "p@ss word", "~allowed:* +@all").await;

    let limited = server.client_with_auth(Some("sidecar"), "p@ss word").await;
    let _: () = limited
        .set("allowed:1", "x", None, None, false)
        .await
        .unwrap();
    let denied = limited
        .set::<(), _, _>("other", "x", None, None, false)
        .await;
    let err = denied.expect_err("NOPERM outside ~allowed:*");
    assert!(err.to_string().contains("NOPERM"), "{err}");

    // Without the password the default user is refused.
    assert!(
        resp::call(server.port(), &["GET", "allowed:1"])
            .unwrap_err()
            .contains("NOAUTH")
    );
    let _ = limited.quit().await;
    let _ = admin.quit().await;
}

/// fred follows `-ASK` mid-migration: `ASKING` and then the command on the importing node,
/// on one connection. fred 10.1.0 sent the command back to the old owner by slot until "Too
/// many redirections", and with one write attempt per command it ended its routing task; the
/// workspace carries the fix (`server/vendor/fred`, see its README). Keys on either side of a
/// half-done migration read, and so do they once it is complete (`-MOVED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fred_follows_ask_redirects_mid_migration() {
    let cluster = RedisCluster::start(3, 0);
    let client = cluster.client().await;
    let keys: Vec<String> = (0..10).map(|i| format!("{{ask}}:{i}")).collect();
    for key in &keys {
        let _: () = client
            .set(key, key.as_str(), None, None, false)
            .await
            .unwrap();
    }
    let slot = slot_of(&keys[0]);
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    let migration = cluster.begin_slot_migration(slot, to);
    cluster.move_slot_keys(&migration, 5);
    for key in &keys {
        let value: Option<String> = client.get(key).await.unwrap();
        assert_eq!(value, Some(key.clone()), "{key} mid-migration");
    }
    // A client with one write attempt per command (the sidecar's flush pool) follows it too,
    // and keeps working afterwards.
    let one_attempt = fred::types::config::Options {
        max_attempts: Some(1),
        ..Default::default()
    };
    for key in &keys {
        let value: Option<String> = client.with_options(&one_attempt).get(key).await.unwrap();
        assert_eq!(value, Some(key.clone()), "{key} with one attempt");
    }
    cluster.finish_slot_migration(migration);
    // Once the migration is complete, -MOVED is followed and every key reads again.
    for key in &keys {
        let value: Option<String> = client.get(key).await.unwrap();
        assert_eq!(value, Some(key.clone()));
    }
}

/// Redis's count of reads from its clients' sockets (`INFO stats`).
async fn reads_processed(client: &Client) -> u64 {
    let info: String = client
        .info(Some(fred::types::InfoKind::Stats))
        .await
        .expect("INFO");
    info_field(&info, "total_reads_processed")
        .and_then(|n| n.parse().ok())
        .expect("total_reads_processed in INFO stats")
}

/// The vendored fred writes a pipeline in one write, custom commands included: Redis reads
/// 200 pipelined INCRs (about 6 KB) at once instead of waking up per command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_custom_commands_reaches_redis_in_one_write() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let observer = redis.client().await;
    for round in 0..3 {
        let before = reads_processed(&observer).await;
        let pipeline = client.pipeline();
        for i in 0..200 {
            let _: () = pipeline
                .custom(fred::cmd!("INCR"), vec![format!("pipelined:{i}")])
                .await
                .expect("buffered");
        }
        let replies: Vec<i64> = pipeline.all().await.expect("the pipeline's replies");
        assert_eq!(replies, vec![round + 1; 200]);
        // The observer's own INFO is one read; the pipeline may arrive in two segments.
        let reads = reads_processed(&observer).await - before;
        assert!(
            reads <= 3,
            "Redis read a pipeline of 200 commands {} times",
            reads - 1
        );
    }
}

/// The vendored fred sends a pipeline once without copying its commands
/// (`Pipeline::try_all_taken`): each command gets its own reply, an error in its place, the
/// writes still in one go, and the pipeline's buffer is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_taken_replies_per_command_and_leaves_its_buffer_empty() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let observer = redis.client().await;
    let _: () = client
        .set("taken:text", "x", None, None, false)
        .await
        .expect("set");
    let before = reads_processed(&observer).await;
    let pipeline = client.pipeline();
    let twin = pipeline.clone();
    for i in 0..200 {
        let key = if i == 100 {
            "taken:text".to_owned()
        } else {
            format!("taken:{i}")
        };
        let _: () = pipeline
            .custom(fred::cmd!("INCR"), vec![key])
            .await
            .expect("buffered");
    }
    let replies = pipeline.try_all_taken::<Value>().await;
    assert_eq!(replies.len(), 200);
    for (i, reply) in replies.into_iter().enumerate() {
        match reply {
            Ok(value) => assert_eq!((i, value), (i, Value::Integer(1))),
            Err(err) => assert!(
                i == 100 && err.details().contains("not an integer"),
                "{i}: {err}"
            ),
        }
    }
    let reads = reads_processed(&observer).await - before;
    assert!(
        reads <= 3,
        "Redis read a pipeline of 200 commands {} times",
        reads - 1
    );
    // The commands moved out: the pipeline's clone, sharing its buffer, has nothing to send.
    assert!(twin.try_all::<Value>().await.is_empty());
}

/// `INCR key` as RESP, as the sidecar encodes a flush.
fn incr_resp(key: &str) -> String {
    format!("*2\r\n$4\r\nINCR\r\n${}\r\n{key}\r\n", key.len())
}

/// `raw_commands`, each reply converted as a pipeline's are: an error reply is an `Err` in its
/// place, an error of the whole a single `Err`.
async fn raw_values(
    client: &Client,
    encoded: impl Into<bytes::Bytes>,
    count: usize,
    hash: fred::types::ClusterHash,
) -> Vec<Result<Value, fred::error::Error>> {
    match client.raw_commands(encoded.into(), count, hash).await {
        Ok(frames) => frames.into_iter().map(Value::try_from).collect(),
        Err(err) => vec![Err(err)],
    }
}

/// The vendored fred writes commands the caller encoded (`raw_commands`) as they are, in one
/// write, and answers each in order with an error in its own place; a client that times out,
/// writes again or reconnects keeps working afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_commands_reach_redis_in_one_write_and_answer_each_in_its_place() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let observer = redis.client().await;
    let _: () = client
        .set("raw:text", "x", None, None, false)
        .await
        .expect("set");
    for round in 1..=3 {
        let keys: Vec<String> = (0..200)
            .map(|i| match i {
                100 => "raw:text".to_owned(),
                i => format!("raw:{i}"),
            })
            .collect();
        let encoded: String = keys.iter().map(|key| incr_resp(key)).collect();
        let before = reads_processed(&observer).await;
        let replies = raw_values(
            &client,
            encoded,
            keys.len(),
            fred::types::ClusterHash::FirstKey,
        )
        .await;
        let reads = reads_processed(&observer).await - before;
        assert!(
            reads <= 3,
            "Redis read 200 raw commands {} times",
            reads - 1
        );
        assert_eq!(replies.len(), 200);
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(value) => assert_eq!((i, value), (i, Value::Integer(round))),
                Err(err) => assert!(
                    i == 100 && err.details().contains("not an integer"),
                    "{i}: {err}"
                ),
            }
        }
    }
    // A transaction inside: its replies are QUEUED and then EXEC's array, like a pipeline's.
    let multi = "*1\r\n$5\r\nMULTI\r\n".to_owned() + &incr_resp("raw:0") + "*1\r\n$4\r\nEXEC\r\n";
    let replies = raw_values(&client, multi, 3, fred::types::ClusterHash::FirstKey).await;
    assert_eq!(
        replies,
        vec![
            Ok(Value::from("OK")),
            Ok(Value::Queued),
            Ok(Value::Array(vec![Value::Integer(4)]))
        ]
    );
    // Nothing to send is nothing sent.
    assert!(
        client
            .raw_commands(bytes::Bytes::new(), 0, fred::types::ClusterHash::FirstKey)
            .await
            .expect("nothing sent")
            .is_empty()
    );
    // The connection is in step: an ordinary command after them gets its own reply.
    let value: i64 = client.incr("raw:0").await.expect("incr");
    assert_eq!(value, 5);
}

/// On a cluster, raw commands go to the node of their `cluster_hash`; one whose key lives
/// elsewhere is answered `-MOVED` in its place, and the others run. Sent to each node, they all
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_commands_on_a_cluster_go_to_one_node_and_a_foreign_key_gets_moved_in_place() {
    let cluster = RedisCluster::start(3, 0);
    let client = cluster.client().await;
    let here = "{raw-a}:1";
    let slot = slot_of(here);
    let node = cluster.primary_for_slot(slot);
    let elsewhere = (0..100)
        .map(|i| format!("{{raw-b{i}}}:1"))
        .find(|key| cluster.primary_for_slot(slot_of(key)) != node)
        .expect("a key of another node");
    let encoded = incr_resp(here) + &incr_resp(&elsewhere) + &incr_resp(here);
    let replies = raw_values(&client, encoded, 3, fred::types::ClusterHash::Custom(slot)).await;
    assert_eq!(replies.len(), 3);
    assert_eq!(replies[0], Ok(Value::Integer(1)));
    let moved = replies[1].as_ref().expect_err("another node's key");
    assert!(moved.details().contains("MOVED"), "{moved:?}");
    assert_eq!(replies[2], Ok(Value::Integer(2)));
    let other = slot_of(&elsewhere);
    let replies = raw_values(
        &client,
        incr_resp(&elsewhere),
        1,
        fred::types::ClusterHash::Custom(other),
    )
    .await;
    assert_eq!(replies, vec![Ok(Value::Integer(1))]);
}
