//! Atomic mode on a standalone Redis: each kept segment is MULTI, its commands, its own XACK,
//! EXEC, inside the flush's one pipeline.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, Drop};
use window_sidecar::proto::{self, Mode};
use window_sidecar_harness::*;

fn atomic_open(key: &str, consumer: &str, count: u32) -> proto::Open {
    proto::Open {
        mode: Mode::Atomic as i32,
        ..stream_open(key, "g", consumer, count)
    }
}

/// `redis-cli MONITOR` on a server: every command it executes, as `NAME arg …` lines.
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(redis: &RedisServer) -> Self {
        let mut child = Command::new("redis-cli")
            .args(["-p", &redis.port().to_string(), "MONITOR"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli");
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // 1700000000.000000 [0 127.0.0.1:1234] "INCR" "k"
                if let Some((_, command)) = line.split_once("] ") {
                    sink.lock().unwrap().push(command.replace('"', ""));
                }
            }
        });
        // MONITOR prints OK once it is attached.
        for _ in 0..100 {
            if std::process::Command::new("redis-cli")
                .args(["-p", &redis.port().to_string(), "CLIENT", "LIST"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cmd=monitor"))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, lines }
    }

    /// The commands seen so far whose name is one of `names`.
    fn commands(&self, names: &[&str]) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|line| names.iter().any(|n| line.split(' ').next() == Some(n)))
            .cloned()
            .collect()
    }
}

impl std::ops::Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn each_kept_segment_is_multi_its_commands_its_xack_exec() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let ids = publish(&mut client, "orders", numbered(3)).await;
    let monitor = Monitor::start(&redis);

    let (mut sub, opened) = Subscription::open(&mut client, atomic_open("orders", "c", 3))
        .await
        .unwrap();
    assert_eq!(opened.mode, Mode::Atomic as i32);
    let read = sub.read().await;
    let d = &read.deliveries;
    sub.send(
        vec![
            command(d[0].slot, "INCR", &["a"]),
            command(d[0].slot, "INCR", &["b"]),
            command(d[1].slot, "INCR", &["dropped"]),
        ],
        // d[2] is acked without commands: it needs no MULTI.
        vec![
            outcome(d[2].slot, Ack),
            outcome(d[1].slot, Drop),
            outcome(d[0].slot, Ack),
        ],
    )
    .await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(
        (report.segments_kept, report.commands, report.settles),
        (2, 2, 3)
    );

    let seen = eventually(STEP, || async {
        monitor.commands(&["MULTI", "EXEC", "INCR", "XACK"]).len() >= 6
    })
    .await;
    assert!(seen);
    assert_eq!(
        monitor.commands(&["MULTI", "EXEC", "INCR", "XACK"]),
        vec![
            "MULTI".to_string(),
            "INCR a".into(),
            "INCR b".into(),
            format!("XACK orders g {}", ids[0]),
            "EXEC".into(),
            format!("XACK orders g {} {}", ids[1], ids[2]),
        ]
    );
    let inspect = redis.client().await;
    assert_eq!(inspect.get::<i64, _>("a").await.unwrap(), 1);
    assert_eq!(inspect.exists::<i64, _>("dropped").await.unwrap(), 0);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_command_refused_while_queuing_aborts_and_the_entry_comes_back() {
    let redis = RedisServer::start();
    // The sidecar's Redis user may not run INCRBY: the sidecar's admission cannot know that
    // (a wrong number of arguments or an unknown command it refuses itself), Redis refuses
    // it while queuing.
    acl_user(
        &redis.client().await,
        "sidecar",
        "pw",
        "~* &* +@all -incrby",
    )
    .await;
    let sidecar = Sidecar::start(&redis.url_with_auth(Some("sidecar"), "pw"), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, atomic_open("orders", "c", 1))
        .await
        .unwrap();
    let first = sub.read().await.deliveries.remove(0);
    // The whole transaction is discarded.
    sub.send(
        vec![
            command(first.slot, "INCR", &["applied-never"]),
            command(first.slot, "INCRBY", &["refused", "1"]),
        ],
        vec![outcome(first.slot, Ack)],
    )
    .await;
    let report = sub.flush().await;
    assert!(!report.ok);
    assert!(
        report.settle_failed,
        "the XACK inside the aborted transaction did not run"
    );
    assert_eq!(report.aborted, 1);
    assert!(report.error.contains("NOPERM"), "{}", report.error);

    // Nothing of the transaction ran, and the entry comes back.
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(again.entry_id, first.entry_id);
    assert_eq!(again.delivery_count, 2);
    let inspect = redis.client().await;
    assert_eq!(inspect.exists::<i64, _>("applied-never").await.unwrap(), 0);
    sub.send(
        vec![command(again.slot, "INCR", &["applied"])],
        vec![outcome(again.slot, Ack)],
    )
    .await;
    assert!(sub.flush().await.ok);
    assert_eq!(inspect.get::<i64, _>("applied").await.unwrap(), 1);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_runtime_error_inside_exec_is_reported_and_the_rest_applies() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = redis.client().await;
    let _: () = inspect
        .set("a-string", "x", None, None, false)
        .await
        .unwrap();
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, atomic_open("orders", "c", 1))
        .await
        .unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![
            command(d.slot, "LPUSH", &["a-string", "v"]),
            command(d.slot, "INCR", &["applied"]),
        ],
        vec![outcome(d.slot, Ack)],
    )
    .await;
    let report = sub.flush().await;
    assert!(!report.ok);
    assert!(report.error.contains("WRONGTYPE"), "{}", report.error);
    assert!(
        !report.settle_failed,
        "Redis has no rollback: the XACK in the EXEC ran"
    );
    assert_eq!(report.aborted, 0);
    assert_eq!(inspect.get::<i64, _>("applied").await.unwrap(), 1);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn the_mixed_window_keeps_thirteen_of_twenty_in_atomic_mode() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(20)).await;
    let inspect = redis.client().await;
    let _: () = inspect
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .unwrap();
    let (mut sub, _) = Subscription::open(&mut client, atomic_open("orders", "c", 20))
        .await
        .unwrap();
    let read = sub.read().await;
    let mut commands = Vec::new();
    let mut outcomes = Vec::new();
    for d in &read.deliveries {
        let n: u32 = field(d, "n").parse().unwrap();
        commands.push(command(d.slot, "INCR", &["side-effects"]));
        outcomes.push(outcome(
            d.slot,
            if n.is_multiple_of(3) { Drop } else { Ack },
        ));
    }
    sub.send(commands, outcomes).await;
    let report = sub.flush().await;
    assert!(report.ok);
    assert_eq!((report.segments_kept, report.settles), (13, 20));
    assert_eq!(inspect.get::<i64, _>("side-effects").await.unwrap(), 13);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    // 13 transactions with their own XACK, and one XACK for the 7 dropped entries.
    assert_eq!(command_calls(&inspect, "multi").await, 13);
    assert_eq!(command_calls(&inspect, "exec").await, 13);
    assert_eq!(command_calls(&inspect, "xack").await, 14);
    sidecar.stop().await;
}
