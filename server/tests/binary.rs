//! The real `window-sidecar` binary: configuration check, `--dev`, and the SIGTERM drain.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use window_sidecar_harness::{RedisServer, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_window-sidecar");

/// The binary running with the given flags; its stderr lines arrive on a channel.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let stderr = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, lines }
    }

    /// Waits for a log line containing `text`; returns it.
    fn wait_for(&self, text: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("the sidecar never logged {text:?}");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn wait(mut self) -> std::process::ExitStatus {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("the sidecar did not exit within 10 s");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn check_config_accepts_a_good_configuration_and_refuses_a_bad_one_with_64() {
    let ok = Command::new(BIN)
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
        let out = Command::new(BIN).args(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.is_empty());
        assert!(!stderr.contains("hunter2"), "a password leaked: {stderr}");
    }
}

#[test]
fn sigterm_drains_and_exits_cleanly() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = Running::start(&["--redis-url", &redis.url(), "--listen", &listen]);
    sidecar.wait_for("Redis answers: SERVING");
    sidecar.signal("TERM");
    sidecar.wait_for("SIGTERM: shutting down");
    sidecar.wait_for("window-sidecar stopped");
    assert!(sidecar.wait().success());
}

#[test]
fn dev_starts_a_throwaway_redis_when_none_answers() {
    let unreachable = format!("redis://127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let sidecar = Running::start(&["--dev", "--redis-url", &unreachable, "--listen", &listen]);
    let line = sidecar.wait_for("started a throwaway redis-server");
    assert!(line.contains("redis://127.0.0.1:"), "{line}");
    sidecar.wait_for("Redis answers: SERVING");
    sidecar.signal("INT");
    sidecar.wait_for("window-sidecar stopped");
    assert!(sidecar.wait().success());
}
