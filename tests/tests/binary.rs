//! The real `window-sidecar` binary: configuration check, `--help` and completions, `--dev`, and
//! the SIGTERM drain.

use std::process::Command;

use window_sidecar_harness::{RedisServer, SidecarProcess, free_port, sidecar_bin};

#[test]
fn check_config_accepts_a_good_configuration_and_refuses_a_bad_one_with_64() {
    let ok = Command::new(sidecar_bin())
        .args([
            "--check-config",
            "--redis-url",
            "redis://user:pw@redis:6379",
            "--shutdown-grace",
            "30s",
        ])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");

    for bad in [
        vec!["--check-config", "--pool-size", "0"],
        vec!["--check-config", "--redis-url", "http://user:hunter2@x"],
        vec!["--check-config", "--shutdown-grace", "soon"],
        vec!["--check-config", "--no-such-flag"],
    ] {
        let out = Command::new(sidecar_bin()).args(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.is_empty());
        assert!(!stderr.contains("hunter2"), "a password leaked: {stderr}");
    }
}

/// `--help` lists the subcommands and the exit codes; `dead-letters --help` its own exit
/// codes; `completions` prints a script for bash, zsh and fish that completes the
/// subcommands and their flags (bash loads it and registers the completion).
#[test]
fn help_lists_the_commands_and_exit_codes_and_completions_are_printed() {
    let run = |args: &[&str]| {
        let out = Command::new(sidecar_bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let help = run(&["--help"]);
    for said in [
        "Usage: window-sidecar [OPTIONS]",
        "window-sidecar <COMMAND>",
        "dead-letters",
        "completions",
        "Exit codes (sysexits)",
        "64  the configuration cannot work",
    ] {
        assert!(help.contains(said), "{said}: {help}");
    }
    let help = run(&["dead-letters", "--help"]);
    for said in ["list", "show", "redrive", "purge", "Exit codes (sysexits)"] {
        assert!(help.contains(said), "{said}: {help}");
    }
    for code in ["0 ", "1 ", "64", "66", "69", "76", "77"] {
        assert!(help.contains(&format!("\n  {code}")), "{code}: {help}");
    }
    for shell in ["bash", "zsh", "fish"] {
        let script = run(&["completions", shell]);
        for word in ["dead-letters", "redrive", "older-than", "redis-url"] {
            assert!(script.contains(word), "{shell}: {word}");
        }
    }
    // A reader that stops early (`| head`) is no error.
    let head = Command::new("bash")
        .args(["-c", "set -o pipefail; \"$0\" completions bash | head -1"])
        .arg(sidecar_bin())
        .output()
        .unwrap();
    assert!(head.status.success(), "{head:?}");
    assert!(head.stderr.is_empty(), "{head:?}");
    let bash = Command::new("bash")
        .args([
            "-c",
            "source <(\"$0\" completions bash) && complete -p window-sidecar",
        ])
        .arg(sidecar_bin())
        .output()
        .unwrap();
    assert!(bash.status.success(), "{bash:?}");
    assert!(
        String::from_utf8_lossy(&bash.stdout).contains("window-sidecar"),
        "{bash:?}"
    );
    // A shell the command does not know is a usage error.
    let out = Command::new(sidecar_bin())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

#[test]
fn sigterm_drains_and_exits_cleanly() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = SidecarProcess::start(&["--redis-url", &redis.url(), "--listen", &listen]);
    sidecar.wait_for("Redis answers: SERVING");
    sidecar.signal("TERM");
    sidecar.wait_for("SIGTERM: shutting down");
    sidecar.wait_for("window-sidecar stopped");
    assert!(sidecar.wait().success());
}

/// A sidecar whose Redis is gone still stops on SIGTERM, within its grace and Redis timeout:
/// nothing waits for a connection that will not come back.
#[test]
fn sigterm_exits_when_redis_is_gone() {
    for scheme in ["redis", "redis-cluster"] {
        // Nothing listens there: the sidecar never reaches Redis.
        let url = format!("{scheme}://127.0.0.1:{}", free_port());
        let listen = format!("127.0.0.1:{}", free_port());
        let mut sidecar = SidecarProcess::start(&[
            "--redis-url",
            &url,
            "--listen",
            &listen,
            "--redis-timeout",
            "1s",
            "--shutdown-grace",
            "1s",
        ]);
        sidecar.wait_for("NOT_SERVING");
        sidecar.signal("TERM");
        sidecar.wait_for("SIGTERM: shutting down");
        let status = sidecar.wait_exit();
        assert!(status.success(), "{scheme}: {status:?}");
        sidecar.wait_for("window-sidecar stopped");
    }
    // Redis that was there and went away. Closing the pools waits one Redis timeout in all,
    // not one per pool: with 6 s it exits within `wait_exit`'s 10 s (one per pool was 12 s).
    let mut redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = SidecarProcess::start(&[
        "--redis-url",
        &redis.url(),
        "--listen",
        &listen,
        "--redis-timeout",
        "6s",
    ]);
    sidecar.wait_for("Redis answers: SERVING");
    redis.kill();
    sidecar.signal("TERM");
    assert!(sidecar.wait_exit().success());
}

/// A sidecar stopped as it starts stops at once: its Redis clients are still in the delay fred
/// sleeps before their first connect, and a QUIT sent then is never answered, so waiting for it
/// would hold the stop for the whole Redis timeout (30 s here, against `wait_exit`'s 10 s).
#[test]
fn sigterm_right_after_the_start_does_not_wait_for_redis() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = SidecarProcess::start(&[
        "--redis-url",
        &redis.url(),
        "--listen",
        &listen,
        "--redis-timeout",
        "30s",
        "--shutdown-grace",
        "1s",
    ]);
    sidecar.wait_for("window-sidecar starting");
    // The signal handlers are installed by then; fred's first connect waits 100 ms at least.
    std::thread::sleep(std::time::Duration::from_millis(20));
    sidecar.signal("TERM");
    sidecar.wait_for("SIGTERM: shutting down");
    let status = sidecar.wait_exit();
    assert!(status.success(), "{status:?}");
    sidecar.wait_for("window-sidecar stopped");
}

#[test]
fn a_wrong_redis_password_is_logged_at_start_as_an_authentication_failure_without_the_password() {
    const WRONG: &str = "n0t-the-pa55word-7f3e";
    let redis = RedisServer::start_with_password("the-right-one");
    let dir = std::env::temp_dir().join(format!("window-sidecar-wrongpass-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let password_file = dir.join("password");
    std::fs::write(&password_file, format!("{WRONG}\n")).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = SidecarProcess::start(&[
        "--redis-url",
        &redis.url(),
        "--redis-username",
        "sidecar",
        "--redis-password-file",
        password_file.to_str().unwrap(),
        "--redis-timeout",
        "1s",
        "--listen",
        &listen,
    ]);
    let line = sidecar.wait_for("authentication to Redis failed");
    assert!(line.contains("WRONGPASS"), "{line}");
    assert!(line.contains("user=sidecar"), "{line}");
    assert!(!line.contains(WRONG), "the password leaked: {line}");
    let line = sidecar.wait_for("NOT_SERVING");
    assert!(
        line.contains("refuses the sidecar's credentials") && line.contains("WRONGPASS"),
        "{line}"
    );
    assert!(!line.contains(WRONG), "the password leaked: {line}");
    sidecar.signal("TERM");
    sidecar.wait_for("window-sidecar stopped");
    let rest = sidecar.logged_lines().join("\n");
    assert!(!rest.contains(WRONG), "the password leaked: {rest}");
    assert!(sidecar.wait().success());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn dev_starts_a_throwaway_redis_when_none_answers() {
    let unreachable = format!("redis://127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar =
        SidecarProcess::start(&["--dev", "--redis-url", &unreachable, "--listen", &listen]);
    let line = sidecar.wait_for("started a throwaway redis-server");
    assert!(line.contains("redis://127.0.0.1:"), "{line}");
    sidecar.wait_for("Redis answers: SERVING");
    sidecar.signal("INT");
    sidecar.wait_for("window-sidecar stopped");
    assert!(sidecar.wait().success());
}

// Multi-threaded: `SidecarProcess::wait_for` blocks, and the client's connection must still close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_picks_the_runtime_and_each_runs_the_window() {
    use fred::prelude::*;
    use std::time::Duration;
    use window_sidecar_harness::{Next, OpenExt, Worker, stream_open};

    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let mut threads = Vec::new();
    for (n, workers) in ["1", "2"].into_iter().enumerate() {
        let key = format!("threads-{workers}");
        for i in 0..100 {
            let _: String = inspect
                .xadd(&key, false, None, "*", vec![("n", i)])
                .await
                .unwrap();
        }
        let listen = format!("127.0.0.1:{}", free_port());
        let sidecar = SidecarProcess::start(&[
            "--redis-url",
            &redis.url(),
            "--listen",
            &listen,
            "--worker-threads",
            workers,
        ]);
        let started = sidecar.wait_for("window-sidecar starting");
        assert!(
            started.contains(&format!("worker_threads={workers}")),
            "{started}"
        );
        // The runtime's own count of its workers: one for the current-thread runtime.
        assert!(
            started.contains(&format!("runtime_workers={workers}")),
            "{started}"
        );
        sidecar.wait_for("Redis answers: SERVING");
        let mut worker = Worker::open(
            &listen,
            stream_open(&key, "g", "c1", 10).with_max_in_flight(20),
        )
        .await;
        let acked = worker.work(10, None).await;
        assert_eq!(acked.len(), 100);
        while worker.reports.iter().map(|r| r.settles).sum::<u32>() < 100 {
            assert!(
                !matches!(worker.next(Duration::from_secs(5)).await, Next::Ended(_)),
                "the stream ended before every flush report"
            );
        }
        let count: i64 = inspect.get("count").await.unwrap();
        assert_eq!(count, 100 * (n as i64 + 1), "every side effect once");
        let pending: Vec<Value> = inspect.xpending(&key, "g", ()).await.unwrap();
        assert_eq!(pending.first(), Some(&Value::Integer(0)), "{pending:?}");
        threads.push(sidecar.thread_count());
        drop(worker);
        sidecar.signal("TERM");
        sidecar.wait_for("window-sidecar stopped");
    }
    // The process's thread count says little about the workers: tokio's blocking pool grows and
    // shrinks beside them (7 threads with one worker and 5 with two were seen on a loaded
    // machine), so the runtime's own count above is what is asserted.
    eprintln!("threads of --worker-threads 1 and 2: {threads:?}");
}

mod crash {
    //! The real binary killed with SIGKILL mid-window: list entries are never lost.

    use std::collections::HashSet;
    use std::time::Duration;

    use fred::prelude::*;
    use window_sidecar::proto;
    use window_sidecar_harness::{RedisServer, SidecarProcess, Worker, free_port};

    fn reliable(consumer: &str, count: u32) -> proto::Open {
        proto::Open {
            source: Some(proto::open::Source::ReliableList(
                proto::ReliableListSource {
                    key: "jobs".into(),
                    consumer: consumer.into(),
                    dead_after: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                },
            )),
            count,
            max_in_flight: count,
            block: Some(prost_types::Duration {
                seconds: 0,
                nanos: 200_000_000,
            }),
            ..Default::default()
        }
    }

    async fn settled(inspect: &Client, total: i64) -> bool {
        let seen: i64 = inspect.scard("seen").await.unwrap();
        let left: i64 = inspect.llen("jobs").await.unwrap();
        seen == total && left == 0
    }

    /// Answers reads until all 30 entries were seen and the list is empty (20 s at most).
    async fn work_until_settled(worker: &mut Worker, inspect: &Client) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !settled(inspect, 30).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not settled in 20 s"
            );
            worker.work_once(Duration::from_millis(500)).await;
        }
    }

    fn start(redis: &RedisServer, listen: &str, extra: &[&str]) -> SidecarProcess {
        let mut args = vec!["--reclaim-interval", "200ms"];
        args.extend_from_slice(extra);
        SidecarProcess::serve(&redis.url(), listen, &args)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reliable_list_survives_sigkill_and_restart_without_losing_an_entry() {
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        for n in 0..30 {
            let _: i64 = inspect.lpush("jobs", format!("v{n}")).await.unwrap();
        }
        let listen = format!("127.0.0.1:{}", free_port());
        let sidecar = start(&redis, &listen, &[]);
        let mut worker = Worker::open(&listen, reliable("c1", 10)).await;
        // One full read, then a read half settled: SIGKILL before its flush.
        worker.work(2, Some(2)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        sidecar.kill9();
        let processing: i64 = inspect.llen("{jobs}:window:processing:c1").await.unwrap();
        // The half-settled read, and maybe a read-ahead of the room its acks made.
        assert!(
            (10..=15).contains(&processing),
            "the unflushed reads' entries wait on the processing list: {processing}"
        );

        let sidecar = start(&redis, &listen, &[]);
        let mut worker = Worker::open(&listen, reliable("c1", 10)).await;
        work_until_settled(&mut worker, &inspect).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let count: i64 = inspect.get("count").await.unwrap();
        let processing: i64 = inspect.llen("{jobs}:window:processing:c1").await.unwrap();
        println!(
            "reliable list after SIGKILL: 30 entries, {count} side effects, {} duplicates (in-flight 10)",
            count - 30
        );
        assert_eq!(processing, 0);
        assert!(
            (30..=40).contains(&count),
            "duplicates are bounded by what was in flight: {count}"
        );
        drop(sidecar);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_replica_recovers_a_killed_ones_entries() {
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        for n in 0..30 {
            let _: i64 = inspect.lpush("jobs", format!("v{n}")).await.unwrap();
        }
        let (a, b) = (
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        );
        let replica_a = start(&redis, &a, &[]);
        let replica_b = start(&redis, &b, &[]);
        let mut worker_a = Worker::open(&a, reliable("pod-a", 10)).await;
        let mut worker_b = Worker::open(&b, reliable("pod-b", 10)).await;
        worker_a.work(1, Some(1)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        replica_a.kill9();
        work_until_settled(&mut worker_b, &inspect).await;
        let seen: HashSet<String> = inspect.smembers("seen").await.unwrap();
        assert_eq!(seen.len(), 30);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let stranded: i64 = inspect
            .llen("{jobs}:window:processing:pod-a")
            .await
            .unwrap();
        assert_eq!(
            stranded, 0,
            "the dead replica's processing list was moved back"
        );
        let count: i64 = inspect.get("count").await.unwrap();
        println!(
            "second replica: 30 entries, {count} side effects, {} duplicates",
            count - 30
        );
        drop(replica_b);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_simple_list_crash_loses_no_more_than_the_in_flight_limit() {
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        for n in 0..20 {
            let _: i64 = inspect.lpush("tasks", n.to_string()).await.unwrap();
        }
        let listen = format!("127.0.0.1:{}", free_port());
        let sidecar = start(&redis, &listen, &[]);
        let open = proto::Open {
            source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
                key: "tasks".into(),
            })),
            count: 5,
            max_in_flight: 5,
            ..Default::default()
        };
        let mut worker = Worker::open(&listen, open).await;
        let mut received = 0;
        while received == 0 {
            received = worker.next_read().await.deliveries.len();
        }
        sidecar.kill9();
        let left: i64 = inspect.llen("tasks").await.unwrap();
        println!(
            "simple list after SIGKILL: {} of 20 lost (in-flight limit 5)",
            20 - left
        );
        assert!(
            left >= 15,
            "lost more than the in-flight limit: {left} left"
        );
    }
}
