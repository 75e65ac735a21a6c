//! Atomic mode on a standalone Redis: each kept segment is one script of its commands, then
//! its own XACK only if none failed, inside the flush's one pipeline.

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
async fn each_kept_segment_is_one_script_of_its_commands_then_its_xack() {
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
        // d[2] is acked without commands: it needs no script.
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

    // MONITOR shows the script, then the commands it ran (`[0 lua]`), the settle last.
    let names = || -> Vec<String> {
        monitor
            .commands(&["MULTI", "EXEC", "EVAL", "INCR", "XACK"])
            .into_iter()
            // The segment's script, not the promoter's: its arguments carry the commands.
            .filter(|line| !line.starts_with("EVAL ") || line.contains(" INCR "))
            .map(|line| match line.starts_with("EVAL ") {
                true => "EVAL".to_owned(),
                false => line,
            })
            .collect()
    };
    let seen = eventually(STEP, || async { names().len() >= 5 }).await;
    assert!(seen, "{:?}", names());
    assert_eq!(
        names(),
        vec![
            "EVAL".to_string(),
            "INCR a".into(),
            "INCR b".into(),
            format!("XACK orders g {}", ids[0]),
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

/// A command that fails when it runs (`WRONGTYPE`, a value that is not an integer) stops its
/// segment: the commands before it stay applied (Redis has no rollback), those after it do not
/// run, and the entry is not acknowledged. The report names the command and Redis's error; the
/// entry comes back with its count raised, and one whose side effect keeps failing ends in the
/// dead letter past `max_deliveries` with Redis's error as its reason.
#[tokio::test]
async fn a_runtime_error_stops_the_segment_and_the_entry_comes_back() {
    let redis = RedisServer::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    let mut client = sidecar.client().await;
    let inspect = redis.client().await;
    let _: () = inspect
        .set("a-string", "x", None, None, false)
        .await
        .unwrap();
    publish(&mut client, "orders", numbered(1)).await;
    let open = proto::Open {
        max_deliveries: 2,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..atomic_open("orders", "c", 1)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    for delivery in 1..=2 {
        let d = sub.read().await.deliveries.remove(0);
        assert_eq!(d.delivery_count, delivery);
        sub.send(
            vec![
                command(d.slot, "INCR", &["before"]),
                command(d.slot, "LPUSH", &["a-string", "v"]),
                command(d.slot, "INCR", &["after"]),
            ],
            vec![outcome(d.slot, Ack)],
        )
        .await;
        let report = sub.flush().await;
        assert!(!report.ok);
        assert!(report.error.starts_with("WRONGTYPE"), "{}", report.error);
        assert!(report.settle_failed, "the entry was not acknowledged");
        assert_eq!(report.aborted, 0, "a command ran before the failed one");
        let failure = &report.side_effect_failures[..];
        assert_eq!(failure.len(), 1, "{report:?}");
        assert_eq!(failure[0].slot, d.slot);
        assert_eq!(failure[0].entry_id, d.entry_id);
        assert_eq!(failure[0].command, "LPUSH");
        assert!(failure[0].error.starts_with("WRONGTYPE"));
        assert!(!failure[0].settled);
        assert_eq!(
            inspect.get::<i64, _>("before").await.unwrap(),
            delivery as i64
        );
        assert_eq!(inspect.exists::<i64, _>("after").await.unwrap(), 0);
        assert_eq!(pending(&inspect, "orders", "g").await, 1);
    }
    // Past max_deliveries: into the dead letter with Redis's error, unread, and settled.
    let moved = eventually(STEP, || async {
        inspect.xlen::<u64, _>("orders:dead").await.unwrap() == 1
    })
    .await;
    assert!(moved, "the poison entry went to the dead letter");
    let dead: Vec<(String, std::collections::HashMap<String, String>)> =
        inspect.xrange("orders:dead", "-", "+", None).await.unwrap();
    let reason = &dead[0].1["h:x-window-reason"];
    assert!(
        reason.starts_with("side effect LPUSH failed: WRONGTYPE"),
        "{reason}"
    );
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    let exposition = scrape(&metrics).await;
    let series = "window_sidecar_side_effect_failures_total{form=\"stream\",mode=\"atomic\"}";
    assert_eq!(sample(&exposition, series), 2.0, "{exposition}");
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
    // The 13 segments in one script with their own XACKs, and one XACK for the 7 dropped
    // entries; no transaction.
    assert_eq!(command_calls(&inspect, "eval").await, 1);
    assert_eq!(command_calls(&inspect, "multi").await, 0);
    assert_eq!(command_calls(&inspect, "xack").await, 14);
    sidecar.stop().await;
}

/// The segments' script goes with its text: a Redis that lost its script cache (`SCRIPT
/// FLUSH`, a restart, a failover to a node that never ran it) runs it all the same, and every
/// entry is settled with its side effects.
#[tokio::test]
async fn a_flushed_script_cache_costs_a_segment_nothing() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = redis.client().await;
    publish(&mut client, "orders", numbered(4)).await;
    let (mut sub, _) = Subscription::open(&mut client, atomic_open("orders", "c", 2))
        .await
        .unwrap();
    for round in 0..2 {
        let _: () = inspect
            .custom(fred::cmd!("SCRIPT"), vec!["FLUSH"])
            .await
            .unwrap();
        let read = sub.read().await;
        let commands = read
            .deliveries
            .iter()
            .map(|d| command(d.slot, "INCR", &["applied"]))
            .collect();
        let outcomes = read
            .deliveries
            .iter()
            .map(|d| outcome(d.slot, Ack))
            .collect();
        sub.send(commands, outcomes).await;
        let report = sub.flush().await;
        assert!(report.ok, "round {round}: {report:?}");
    }
    assert_eq!(inspect.get::<i64, _>("applied").await.unwrap(), 4);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}
