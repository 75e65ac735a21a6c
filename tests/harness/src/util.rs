//! Shared plumbing: owned temp dirs, spawning a server and waiting for its port, killing by pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// A directory under the system temp dir, removed (recursively) on drop.
///
/// Set `HARNESS_KEEP_DIRS=1` to keep them (and the redis logs in them) for debugging.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(kind: &str) -> Self {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("window-sidecar-{kind}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("HARNESS_KEEP_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// How a freshly spawned process proves the port is really its own (and that it is ready):
/// it must report its own pid as `process_id` in `INFO server`.
#[derive(Debug, Clone)]
pub(crate) enum Probe {
    /// Plain RESP on the port.
    Resp,
    /// `redis-cli` with these extra arguments (TLS flags) before `-p <port>`.
    Cli(Vec<String>),
}

impl Probe {
    /// `Some(true)`: our process answers; `Some(false)`: another process owns the port;
    /// `None`: not ready yet.
    fn check(&self, port: u16, pid: u32) -> Option<bool> {
        let info = match self {
            Probe::Resp => crate::resp::call_text(port, &["INFO", "server"]).ok()?,
            Probe::Cli(args) => {
                let out = Command::new("redis-cli")
                    .args(args)
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "INFO", "server"])
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .output()
                    .ok()?;
                String::from_utf8_lossy(&out.stdout).into_owned()
            }
        };
        let reported: u32 = info_field(&info, "process_id")?.parse().ok()?;
        Some(reported == pid)
    }
}

/// A `redis-server` process (server or sentinel) on a loopback port, with its own temp dir
/// holding its config/log files; SIGKILLed by pid and its dir removed on drop.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) port: u16,
    pub(crate) dir: TempDir,
    args: Vec<String>,
    probe: Probe,
    child: Option<Child>,
}

impl Proc {
    /// Picks a free port, lets `args(port, dir)` build the `redis-server` arguments (it may
    /// write files into `dir` and pick more ports), spawns it and waits until it answers `probe`.
    /// Retries with fresh ports when the process exits or another process owns the port.
    pub(crate) fn start(
        kind: &str,
        probe: Probe,
        mut args: impl FnMut(u16, &Path) -> Vec<String>,
    ) -> Self {
        for _ in 0..8 {
            let port = crate::free_port();
            let dir = TempDir::new(&format!("{kind}-{port}"));
            let mut proc = Self {
                port,
                args: args(port, dir.path()),
                dir,
                probe: probe.clone(),
                child: None,
            };
            if proc.spawn() {
                return proc;
            }
        }
        panic!("could not start a {kind} redis-server on a free port after 8 attempts");
    }

    /// Spawns the process again with the same arguments (same ports, same dir).
    pub(crate) fn spawn(&mut self) -> bool {
        self.kill();
        let mut child = Command::new(crate::redis_server_bin())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed and runnable");
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false; // exited: most likely a port was taken meanwhile
            }
            match self.probe.check(self.port, pid) {
                Some(true) => {
                    self.child = Some(child);
                    return true;
                }
                Some(false) => break, // someone else listens there
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Replaces the arguments used by the next [`Self::spawn`] (same port and dir).
    pub(crate) fn set_args(&mut self, args: Vec<String>) {
        self.args = args;
    }

    /// SIGKILL by pid, then reap.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The last lines of the process's log (`<dir>/redis.log`), for panic messages.
    pub(crate) fn log_tail(&self) -> String {
        tail(&self.log_path(), 15)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        // then `dir` is dropped: removed
    }
}

/// `s` as a `String` argument.
pub(crate) fn arg(s: impl AsRef<Path>) -> String {
    s.as_ref().to_string_lossy().into_owned()
}

/// The last `lines` lines of a (log) file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Value of `field:` in an `INFO`-style reply.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Polls `check` every `every` until it holds; after `timeout`, panics with `what`, the last
/// reason it gave and `diagnostics()` (the nodes' logs, say).
pub(crate) fn wait_until(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<(), String>,
    diagnostics: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let why = match check() {
            Ok(()) => return,
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            panic!("{what} within {timeout:?}: {why}\n{}", diagnostics());
        }
        std::thread::sleep(every);
    }
}
