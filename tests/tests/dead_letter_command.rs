//! The `window-sidecar dead-letters` command's own answers: each dead letter printed as it is
//! redriven, also when the command or its sidecar is killed half-way (which loses and doubles
//! nothing: a second redrive finishes the job), its flags named in usage errors, ids that are
//! not there, each reason it cannot talk to a sidecar, each with its sysexits code, and a
//! sidecar reached on its Unix socket.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar_harness::dead_letters::{StreamDeadLetters, admin, cli};
use window_sidecar_harness::{
    Launch, RedisServer, Sidecar, SidecarProcess, TlsMaterial, connect_client, eventually,
    free_port, sidecar_bin,
};

/// A redrive whose sidecar is killed (SIGKILL) half-way leaves every dead letter either still
/// a dead letter or redriven exactly once; a second redrive finishes the job without doubles.
/// The redrive writes copies (`--to`), the one way a redrive adds entries that a crash could
/// double.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_killed_half_way_loses_and_doubles_nothing() {
    const N: usize = 300;
    let redis = RedisServer::start();
    let client = redis.client().await;
    for i in 0..N {
        let _: String = client
            .xadd(
                "kill:dead",
                false,
                None,
                "*",
                vec![
                    ("_payload", i.to_string()),
                    ("h:x-window-subscription", "kill:orders/g".to_owned()),
                ],
            )
            .await
            .unwrap();
    }
    let start = |listen: &str| {
        Launch::new()
            .args(["--redis-url", &redis.url(), "--listen", listen])
            .start()
    };
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = start(&listen);
    drop(connect_client(&listen).await);
    let redrive = Command::new(sidecar_bin())
        .args([
            "dead-letters",
            "redrive",
            "stream:kill:dead",
            "--all",
            "--to",
            "kill:orders",
            "--rate",
            "300",
        ])
        .env("WINDOW_SIDECAR_ADDR", &listen)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Half-way at 300/s.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let moved: u64 = client.xlen("kill:orders").await.unwrap_or(0);
            moved >= 100
        })
        .await
    );
    sidecar.kill9();
    let redrive = redrive.wait_with_output().unwrap();

    let (moved, left) = each_redriven_once_or_still_dead(&client, N, false).await;
    assert!(
        moved > 0 && left > 0,
        "killed half-way: {moved} moved, {left} left"
    );
    // The command printed what it redrove before the sidecar went away, and says so.
    let (out, err) = (
        String::from_utf8_lossy(&redrive.stdout),
        String::from_utf8_lossy(&redrive.stderr),
    );
    let printed = redrove_lines(&out);
    assert!(!printed.is_empty(), "nothing printed: {err}");
    assert!(
        printed.len() <= moved,
        "{} printed, {moved} moved",
        printed.len()
    );
    still_dead_none_of(&client, "kill:dead", &printed).await;
    assert_eq!(redrive.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&format!("No sidecar at {listen}"))
            && err.contains(&format!(
                "{} of the {N} dead letters chosen were redriven before",
                printed.len()
            )),
        "{err}"
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = start(&listen);
    drop(connect_client(&listen).await);
    let (code, out, err) = cli(
        &listen,
        &[
            "redrive",
            "stream:kill:dead",
            "--all",
            "--to",
            "kill:orders",
            "--rate",
            "0",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("{left} of {left} dead letters redriven")),
        "{out}"
    );
    each_redriven_once_or_still_dead(&client, N, true).await;
    sidecar.terminate();
}

/// Each of the `n` dead letters of `kill:dead` is either still a dead letter or on
/// `kill:orders` exactly once (all moved, when `expect_all_moved`); returns how many moved and
/// how many are left.
async fn each_redriven_once_or_still_dead(
    client: &Client,
    n: usize,
    expect_all_moved: bool,
) -> (usize, usize) {
    let dead: Vec<(String, HashMap<String, String>)> =
        client.xrange("kill:dead", "-", "+", None).await.unwrap();
    let moved: Vec<(String, HashMap<String, String>)> =
        client.xrange("kill:orders", "-", "+", None).await.unwrap();
    let mut copies: HashMap<String, usize> = HashMap::new();
    for (_, fields) in &moved {
        *copies.entry(fields["_payload"].clone()).or_default() += 1;
    }
    let still: Vec<String> = dead.iter().map(|(_, f)| f["_payload"].clone()).collect();
    for i in 0..n {
        let p = i.to_string();
        let (n, dead) = (copies.get(&p).copied().unwrap_or(0), still.contains(&p));
        assert!(
            (n == 1 && !dead) || (n == 0 && dead),
            "dead letter {p}: {n} copies, still a dead letter: {dead}"
        );
    }
    if expect_all_moved {
        assert!(still.is_empty());
    }
    (moved.len(), still.len())
}

/// The ids of the `redrove ID to KEY …` lines of the command's output.
fn redrove_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("redrove "))
        .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
        .collect()
}

/// None of `ids` is still a dead letter on the stream `dead`.
async fn still_dead_none_of(client: &Client, dead: &str, ids: &[String]) {
    let left: Vec<(String, HashMap<String, String>)> =
        client.xrange(dead, "-", "+", None).await.unwrap();
    for id in ids {
        assert!(
            !left.iter().any(|(left, _)| left == id),
            "{id} was printed as redriven but is still a dead letter"
        );
    }
}

/// A redrive prints each dead letter as its batch returns, not when the whole call ends: the
/// command killed (SIGKILL) half-way has printed what it moved, and each line printed is a
/// dead letter that moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_prints_each_dead_letter_as_it_goes() {
    use std::io::BufRead;
    const N: usize = 300;
    let redis = RedisServer::start();
    let client = redis.client().await;
    for i in 0..N {
        let _: String = client
            .xadd(
                "slow:dead",
                false,
                None,
                "*",
                vec![
                    ("_payload", i.to_string()),
                    ("h:x-window-subscription", "slow:orders/g".to_owned()),
                ],
            )
            .await
            .unwrap();
    }
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let addr = sidecar.addr.to_string();
    drop(connect_client(&addr).await);
    // 100 a second: the whole redrive takes 3 s, its first lines come within a fraction.
    let mut redrive = Command::new(sidecar_bin())
        .args([
            "dead-letters",
            "redrive",
            "stream:slow:dead",
            "--all",
            "--to",
            "slow:orders",
        ])
        .env("WINDOW_SIDECAR_ADDR", &addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = redrive.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            lines.push(line.unwrap());
            if lines.len() == 20 {
                break;
            }
        }
        lines
    });
    let lines = tokio::time::timeout(Duration::from_secs(10), lines)
        .await
        .expect("20 lines within 10 s")
        .unwrap();
    redrive.kill().unwrap();
    let _ = redrive.wait();
    let printed = redrove_lines(&lines.join("\n"));
    assert_eq!(printed.len(), 20, "{lines:?}");
    still_dead_none_of(&client, "slow:dead", &printed).await;
    let left: u64 = client.xlen("slow:dead").await.unwrap();
    assert!(left > 0, "the command was killed before the end");
    sidecar.stop().await;
}

/// What the command line alone decides fails before any call, as a usage error (64) naming
/// the command's flags, not the service's field names; an id that is no dead letter fails
/// (66) naming it and the stream or list, and nothing is changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_names_its_flags_and_the_dead_letters_it_looked_in() {
    let on = StreamDeadLetters::start().await;
    let (addr, client) = (&on.addr, &on.client);
    let mut admin = admin(addr).await;
    let first = on.listed(&mut admin).await.dead_letters[0].id.clone();
    let dead_letters = || async {
        let len: u64 = client.xlen("dl:orders:dead").await.unwrap();
        len
    };

    // No selection: a usage error, told before any call (no sidecar needed).
    let nowhere = format!("127.0.0.1:{}", free_port());
    for at in [addr.as_str(), nowhere.as_str()] {
        for action in ["redrive", "purge"] {
            let (code, _, err) = cli(at, &[action, "stream:dl:orders:dead"]);
            assert_eq!(code, 64, "{action}: {err}");
            for named in [
                "--id",
                "--reason",
                "--older-than",
                "--all",
                "stream dl:orders:dead",
            ] {
                assert!(err.contains(named), "{action}: {named}: {err}");
            }
            for proto_name in ["all: true", "older_than", "`ids`"] {
                assert!(!err.contains(proto_name), "{action}: {proto_name}: {err}");
            }
        }
    }

    // An id that is not there: 66, naming the id and the stream; nothing moves, not even the
    // id given with it that is there.
    for action in ["redrive", "purge"] {
        let (code, out, err) = cli(
            addr,
            &[
                action,
                "stream:dl:orders:dead",
                "--id",
                &first,
                "--id",
                "999-0",
            ],
        );
        assert_eq!(code, 66, "{action}: {out}{err}");
        assert!(
            err.contains("--id 999-0: no dead letter 999-0 in stream dl:orders:dead"),
            "{action}: {err}"
        );
        assert!(!err.contains(&first), "{action}: {err}");
        assert_eq!(dead_letters().await, 3, "{action} changed nothing");
    }
    let (code, _, err) = cli(addr, &["show", "stream:dl:orders:dead", "999-0"]);
    assert_eq!(code, 66, "{err}");
    assert!(
        err.contains("no dead letter 999-0 in stream dl:orders:dead"),
        "{err}"
    );
    let (code, _, err) = cli(addr, &["purge", "list:dl:none", "--id", "0:feed"]);
    assert_eq!(code, 66, "{err}");
    assert!(
        err.contains("no dead letter 0:feed in list dl:none"),
        "{err}"
    );

    // A list beyond what one call returns names --limit.
    let (code, _, err) = cli(addr, &["list", "stream:dl:orders:dead", "--limit", "20000"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--limit"), "{err}");

    // The id that is there still goes, alone.
    let (code, out, err) = cli(addr, &["redrive", "stream:dl:orders:dead", "--id", &first]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 of 1 dead letters redriven"), "{out}");
    assert_eq!(dead_letters().await, 2);
    on.sidecar.stop().await;
}

/// On the pod, the sidecar may listen on a Unix socket only (`--listen unix:PATH`): the command
/// reaches it at `unix:PATH`.
#[tokio::test]
async fn the_command_reaches_a_sidecar_on_a_unix_socket() {
    let redis = RedisServer::start();
    let path = std::env::temp_dir().join(format!("window-sidecar-{}.sock", free_port()));
    let socket = format!("unix:{}", path.display());
    let sidecar = SidecarProcess::serve(&redis.url(), &socket, &[]);
    let (code, out, err) = cli(&socket, &["list", "stream:dl:orders:dead"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0 shown of 0 dead letters"), "{out}");
    drop(sidecar);
    let _ = std::fs::remove_file(path);
}

/// A sidecar the command cannot talk to is named with the reason: nothing listens, the host
/// does not resolve, a socket file is missing (69); a URL where host:port belongs (64); TLS
/// against a plaintext sidecar, plaintext against a TLS one, a CA that does not sign its
/// certificate, and no client certificate for one that requires it (76).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_says_why_it_cannot_talk_to_the_sidecar() {
    let redis = RedisServer::start();
    let plain = Sidecar::start(&redis.url(), &[]).await;
    let plain_addr = plain.addr.to_string();
    drop(connect_client(&plain_addr).await);
    let material = TlsMaterial::generate_temp();
    let other = TlsMaterial::generate_temp();
    let file = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (cert, key, ca) = (
        file(&material.server_cert),
        file(&material.server_key),
        file(&material.ca_cert),
    );
    let tls = Sidecar::start(&redis.url(), &["--tls-cert", &cert, "--tls-key", &key]).await;
    let tls_addr = tls.addr.to_string();
    let mutual = Sidecar::start(
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
    let mutual_addr = mutual.addr.to_string();
    let list = ["list", "stream:dl:orders:dead"];
    let with = |extra: &[&str]| -> Vec<String> {
        list.iter().chain(extra).map(|s| (*s).to_owned()).collect()
    };
    let run = |addr: &str, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(addr, &args)
    };

    // The right CA (and the client certificate where required) works.
    assert!(
        eventually(Duration::from_secs(10), || async {
            run(&tls_addr, with(&["--tls-ca", &ca])).0 == 0
        })
        .await
    );
    let (client_cert, client_key) = (file(&material.client_cert), file(&material.client_key));
    let (code, _, err) = run(
        &mutual_addr,
        with(&[
            "--tls-ca",
            &ca,
            "--tls-cert",
            &client_cert,
            "--tls-key",
            &client_key,
        ]),
    );
    assert_eq!(code, 0, "{err}");

    let port = free_port();
    let cases: Vec<(String, Vec<String>, i32, Vec<String>)> = vec![
        (
            format!("127.0.0.1:{port}"),
            with(&[]),
            69,
            vec![
                format!("No sidecar at 127.0.0.1:{port} (connection refused)"),
                "--sidecar".into(),
            ],
        ),
        (
            "no-such-host.invalid:50051".into(),
            with(&[]),
            69,
            vec!["No sidecar at no-such-host.invalid:50051 (its host name does not resolve".into()],
        ),
        (
            "unix:/nonexistent/window-sidecar.sock".into(),
            with(&[]),
            69,
            vec![
                "No sidecar at unix:/nonexistent/window-sidecar.sock (no such socket file)".into(),
            ],
        ),
        (
            format!("http://{plain_addr}"),
            with(&[]),
            64,
            vec![format!(
                "--sidecar (WINDOW_SIDECAR_ADDR) \"http://{plain_addr}\" is a URL: write host:port (\"{plain_addr}\")"
            )],
        ),
        (
            plain_addr.clone(),
            with(&["--tls-ca", &ca]),
            76,
            vec!["does not speak TLS".into(), "--tls-ca".into()],
        ),
        (
            tls_addr.clone(),
            with(&[]),
            76,
            vec!["it likely speaks TLS, so give its CA with --tls-ca".into()],
        ),
        (
            tls_addr.clone(),
            with(&["--tls-ca", &file(&other.ca_cert)]),
            76,
            vec!["presented a certificate that --tls-ca does not accept".into()],
        ),
        (
            mutual_addr.clone(),
            with(&["--tls-ca", &ca]),
            76,
            vec![
                "requires a client certificate (mutual TLS), so give --tls-cert and --tls-key"
                    .into(),
            ],
        ),
    ];
    for (addr, args, want, says) in cases {
        let (code, out, err) = run(&addr, args.clone());
        assert_eq!(code, want, "{addr} {args:?}: {out}{err}");
        for said in &says {
            assert!(
                err.contains(said.as_str()),
                "{addr} {args:?}: {said}: {err}"
            );
        }
        assert!(!err.contains("transport error\n"), "{err}");
    }
    mutual.stop().await;
    tls.stop().await;
    plain.stop().await;
}
