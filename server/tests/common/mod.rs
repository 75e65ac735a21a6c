//! The real `window-sidecar` binary as a child process, shared by the tests that need a process
//! to kill, signal or measure.
#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_window-sidecar");

/// The binary running with the given flags; its stderr lines arrive on a channel.
pub struct Running {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("SIDECAR_LOG").unwrap_or_else(|_| "info".into()),
            )
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
    pub fn wait_for(&self, text: &str) -> String {
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

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGKILL: no drain, no flush.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
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

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the sidecar is running");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }
}
